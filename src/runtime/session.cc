#include "runtime/session.h"

#include <algorithm>

#include "core/error.h"
#include "model/paged_plan.h"

namespace kvcache {

namespace {

PagedPlanOptions paged_plan_options(const CacheConfig& cc, const SessionConfig& config) {
  PagedPlanOptions po;
  po.block_tokens = cc.options.paged.block_tokens;
  po.kv_dtype = cc.options.kv_dtype.value_or(DType::kF32);
  po.budget_bytes = config.kv_budget_bytes;
  po.max_tokens_per_step = std::max<int64_t>(1, config.prefill_chunk);
  po.max_cached_tokens = cc.options.max_cache_len;
  po.layer_types = cc.layer_types;
  po.sliding_window = cc.sliding_window;
  // Hybrid models: the one sequence's state. No snapshots: the session's prefill chunks do not
  // stop at block boundaries, so a session's reuse_prefix never hits on a hybrid model (0).
  po.linear = cc.linear;
  po.linear_slots = 1;
  po.max_snapshots = 0;
  po.compressed = cc.compressed;
  po.shared_kv = cc.kv_content == CacheConfig::KVContent::kSharedKV;
  po.quant = cc.options.paged.quant;  // quantized pages (issue 43)
  return po;
}

CacheConfig base_cache_config(const ModelConfig& model, const SessionConfig& config) {
  if (config.cache.max_batch_size > 1)
    throw Error(ErrorKind::kInvalidArgument,
                "session: cache.max_batch_size " + std::to_string(config.cache.max_batch_size) +
                    ": a session holds one sequence (leave it 0 or 1)");
  if (config.cache.paged.store)
    throw Error(ErrorKind::kInvalidArgument,
                "session: cache.paged.store is built by the session from its memory plan; leave "
                "it unset");
  CacheConfig cc = model_cache_config(model, config.cache);
  if (config.sliding_window_override > 0) {
    cc.layer_types.assign(static_cast<size_t>(model.n_layers), "sliding_attention");
    cc.sliding_window = config.sliding_window_override;
  }
  CacheOptions& o = cc.options;
  if (o.max_cache_len <= 0) o.max_cache_len = model.max_seq_len;
  o.max_batch_size = 1;
  o.kv_dtype = o.kv_dtype.value_or(DType::kF32);
  return cc;
}

// With a paged budget, the planner may shrink the step: prefill chunks follow it, so that the
// activations stay within what was planned.
SessionConfig effective_config(const ModelConfig& model, SessionConfig config) {
  if (config.cache.implementation == "paged" && config.kv_budget_bytes > 0 &&
      config.prefill_chunk > 0) {
    const CacheConfig cc = base_cache_config(model, config);
    config.prefill_chunk =
        plan_paged_memory(model, paged_plan_options(cc, config)).max_tokens_per_step;
  }
  return config;
}

}  // namespace

CacheConfig make_cache_config(const ModelConfig& model, const SessionConfig& config) {
  CacheConfig cc = base_cache_config(model, config);
  if (config.cache.implementation == "paged") {
    const PagedMemoryPlan plan = plan_paged_memory(model, paged_plan_options(cc, config));
    cc.options.paged.store = std::make_shared<PagedKVStore>(plan.store);
  }
  return cc;
}

Session::Session(const Model& model, const SessionConfig& config)
    : model_(model),
      config_(effective_config(model.config(), config)),
      forward_(model, config_.kernel, std::max<int64_t>(1, config_.prefill_chunk)) {
  if (config.prefill_chunk <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "prefill chunk must be positive");
  }
  CacheConfig cc = make_cache_config(model.config(), config_);
  paged_ = cc.options.paged.store;
  cache_ = std::make_unique<Cache>(cc);
}

void Session::ensure_sequence() {
  if (!paged_ || (seq_ >= 0 && paged_->is_live(seq_))) return;
  seq_ = paged_->add_sequence();
  const SeqId batch[1] = {seq_};
  paged_->set_batch(batch);
}

int64_t Session::reuse_prefix(std::span<const int32_t> prompt) {
  if (!paged_ || pos_ != 0) return 0;
  ensure_sequence();
  const int64_t n = paged_->attach_prefix(seq_, prompt);
  pos_ = n;
  return n;
}

std::span<const float> Session::prefill(std::span<const int32_t> ids) {
  if (ids.empty()) throw Error(ErrorKind::kInvalidArgument, "prefill: no tokens");
  std::span<const float> logits;
  for (size_t off = 0; off < ids.size(); off += static_cast<size_t>(config_.prefill_chunk)) {
    const size_t n = std::min(ids.size() - off, static_cast<size_t>(config_.prefill_chunk));
    if (paged_) {  // plan the step with its token ids, so full blocks enter the prefix index
      ensure_sequence();
      if (paged_->plan_step(static_cast<int64_t>(n), ids.subspan(off, n)) ==
          StepStatus::kOutOfBlocks)
        throw Error(ErrorKind::kOutOfRange, "paged cache: out of blocks at position " +
                                                std::to_string(pos_) +
                                                "; raise --kv-budget / --max-cache-len");
    }
    ForwardParams p;
    p.tokens = ids.data() + off;
    p.n_tokens = static_cast<int64_t>(n);
    p.pos0 = pos_;
    p.cache = cache_.get();
    p.logits = off + n == ids.size() ? LogitsMode::kLast : LogitsMode::kNone;
    logits = forward_.forward(p);
    pos_ += static_cast<int64_t>(n);
  }
  return logits;
}

std::span<const float> Session::forward_all(std::span<const int32_t> ids, bool batch_invariant) {
  if (ids.empty()) throw Error(ErrorKind::kInvalidArgument, "forward_all: no tokens");
  if (paged_) {
    ensure_sequence();
    if (paged_->plan_step(static_cast<int64_t>(ids.size()), ids) == StepStatus::kOutOfBlocks)
      throw Error(ErrorKind::kOutOfRange,
                  "paged cache: out of blocks; raise --kv-budget / --max-cache-len");
  }
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.pos0 = pos_;
  p.cache = cache_.get();
  p.logits = LogitsMode::kAll;
  p.batch_invariant = batch_invariant;
  std::span<const float> logits = forward_.forward(p);
  pos_ += static_cast<int64_t>(ids.size());
  return logits;
}

void Session::rollback(int64_t n) {
  if (n < 0 || n > pos_)
    throw Error(
        ErrorKind::kInvalidArgument,
        "rollback of " + std::to_string(n) + " tokens: the session holds " + std::to_string(pos_));
  cache_->crop(-n);  // crop(0) keeps everything (cache/crop_rule.h)
  pos_ -= n;
}

void Session::reserve(int64_t tokens) {
  if (tokens < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "session reserve(" + std::to_string(tokens) + "): tokens must be >= 0");
  cache_->reserve(std::min(tokens, cache_->config().options.max_cache_len));
}

void Session::restored(int64_t position) {
  if (paged_)
    throw Error(ErrorKind::kUnsupported,
                "a paged session cannot be restored from a session file; use --cache dynamic or "
                "static");
  if (position != cache_->seq_length())
    throw Error(ErrorKind::kFormat, "session restore: the file lists " + std::to_string(position) +
                                        " tokens but the cache holds " +
                                        std::to_string(cache_->seq_length()));
  pos_ = position;
}

void Session::reset() {
  cache_->reset();
  pos_ = 0;
}

std::span<const float> recompute_last_logits(Forward& fwd, std::span<const int32_t> ids) {
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.pos0 = 0;
  p.cache = nullptr;
  p.logits = LogitsMode::kLast;
  return fwd.forward(p);
}

}  // namespace kvcache
