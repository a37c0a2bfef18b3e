#include "runtime/session.h"

#include <algorithm>

#include "core/error.h"

namespace kvcache {

CacheConfig make_cache_config(const ModelConfig& model, const SessionConfig& config) {
  CacheConfig cc;
  cc.implementation = config.cache;
  cc.layer_types = model.layer_types;
  cc.sliding_window = model.sliding_window;
  cc.attention_chunk_size = model.attention_chunk_size;
  cc.num_kv_shared_layers = static_cast<int>(model.num_kv_shared_layers);
  if (config.sliding_window_override > 0) {
    cc.layer_types.assign(static_cast<size_t>(model.n_layers), "sliding_attention");
    cc.sliding_window = config.sliding_window_override;
  }
  cc.max_cache_len = config.max_cache_len > 0 ? config.max_cache_len : model.max_seq_len;
  cc.max_batch_size = 1;
  cc.kv_dtype = config.kv_dtype.value_or(DType::kF32);
  return cc;
}

Session::Session(const LlamaModel& model, const SessionConfig& config)
    : model_(model),
      config_(config),
      cache_(std::make_unique<Cache>(make_cache_config(model.config(), config))),
      forward_(model, config.kernel, std::max<int64_t>(1, config.prefill_chunk)) {
  if (config.prefill_chunk <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "prefill chunk must be positive");
  }
}

std::span<const float> Session::prefill(std::span<const int32_t> ids) {
  if (ids.empty()) throw Error(ErrorKind::kInvalidArgument, "prefill: no tokens");
  std::span<const float> logits;
  for (size_t off = 0; off < ids.size(); off += static_cast<size_t>(config_.prefill_chunk)) {
    const size_t n = std::min(ids.size() - off, static_cast<size_t>(config_.prefill_chunk));
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

std::span<const float> Session::forward_all(std::span<const int32_t> ids) {
  if (ids.empty()) throw Error(ErrorKind::kInvalidArgument, "forward_all: no tokens");
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.pos0 = pos_;
  p.cache = cache_.get();
  p.logits = LogitsMode::kAll;
  std::span<const float> logits = forward_.forward(p);
  pos_ += static_cast<int64_t>(ids.size());
  return logits;
}

void Session::reset() {
  cache_->reset();
  pos_ = 0;
}

std::span<const float> recompute_last_logits(LlamaForward& fwd, std::span<const int32_t> ids) {
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = static_cast<int64_t>(ids.size());
  p.pos0 = 0;
  p.cache = nullptr;
  p.logits = LogitsMode::kLast;
  return fwd.forward(p);
}

}  // namespace kvcache
