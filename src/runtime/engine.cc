#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <utility>

#include "core/digest.h"
#include "core/error.h"
#include "core/fault.h"
#include "kernels/kv_quant.h"
#include "kernels/paged_attention.h"
#include "model/fingerprint.h"
#include "model/paged_plan.h"
#include "runtime/speculative.h"

namespace kvcache {

namespace {

using Clock = std::chrono::steady_clock;

// Tokens the pool holds when neither a budget nor cache.max_cache_len sizes it.
constexpr int64_t kDefaultPoolTokens = 16384;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The most blocks of a sliding group (window W) a request of `tokens` tokens holds at once: a
// step of c <= chunk tokens at position p holds the keys [max(0, p - W + 1), p + c) (its first
// query's window and its own keys; PagedKVStore::drop_out_of_window releases the rest before
// plan_step), maximized over every p and the largest c left there. At most
// ceil((W - 1 + chunk) / bt) + 1; fewer where the request's start or end clips the span.
int64_t sliding_blocks(int64_t tokens, int64_t window, int64_t chunk, int64_t bt) {
  int64_t most = 0;
  const auto at = [&](int64_t p) {
    const int64_t c = std::min(chunk, tokens - p);
    const int64_t lo = std::max<int64_t>(0, p - window + 1);
    most = std::max(most, (p + c - 1) / bt - lo / bt + 1);
  };
  // From p = W - 1 on, the count repeats every bt positions until the end clips c: the first
  // W + bt positions and the last chunk + bt cover every value.
  const int64_t head = std::min(tokens, window + bt);
  for (int64_t p = 0; p < head; ++p) at(p);
  for (int64_t p = std::max(head, tokens - chunk - bt); p < tokens; ++p) at(p);
  return most;
}

// Speculative decoding: the most rows a decoding sequence at `computed` may feed after its last
// token in a step: inside its last block without filling it (Engine::propose_drafts), and below
// its request's context (plain decoding feeds positions up to context - 2).
int64_t draft_room(int64_t computed, int64_t context, int64_t block_tokens) {
  const int64_t in_block = (computed / block_tokens + 1) * block_tokens - computed - 2;
  return std::min(in_block, context - computed - 2);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Bytes at the end of `s` that start an incomplete UTF-8 sequence (0..3): held back from a
// stream so a client never sees half a character.
size_t incomplete_utf8_tail(const std::string& s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= std::min<size_t>(3, n); ++back) {
    const auto c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return len > back ? back : 0;
  }
  return 0;
}

// An exception's message for a client: what failed, not the C++ type.
std::string describe(const std::exception& e) {
  if (dynamic_cast<const std::bad_alloc*>(&e) != nullptr)
    return "out of memory (" + std::string(e.what()) + ")";
  return e.what();
}

// A bug found at run time: the engine must not go on from an unknown state.
[[noreturn]] void fatal(const std::string& message) {
  std::fprintf(stderr, "kvcache engine: fatal: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace

std::string logprob_piece(const Tokenizer* tokenizer, int32_t token) {
  return tokenizer != nullptr ? tokenizer->decode(token) : "token_id:" + std::to_string(token);
}

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "none";
}

const char* scheduler_policy_name(SchedulerPolicy p) {
  return p == SchedulerPolicy::kPrefillFirst ? "prefill-first" : "fifo";
}

SchedulerPolicy parse_scheduler_policy(const std::string& name) {
  if (name == "fifo") return SchedulerPolicy::kFifo;
  if (name == "prefill-first" || name == "prefill_first") return SchedulerPolicy::kPrefillFirst;
  throw Error(ErrorKind::kInvalidArgument,
              "scheduler \"" + name + "\" is not known; use fifo or prefill-first");
}

enum class SeqState { kPendingFork, kWaiting, kRunning, kFinished };

struct Engine::Seq {
  Request* req = nullptr;
  int32_t index = 0;
  SeqState state = SeqState::kWaiting;
  SeqId sid = -1;               // store sequence while resident
  std::vector<int32_t> tokens;  // prompt + generated (the last one not yet fed)
  int64_t computed = 0;         // tokens whose K/V are in the cache
  int64_t computed_disk = 0;    // of those attached from the prefix cache, loaded from disk
  int64_t computed_remote = 0;  // ... and loaded from the remote tier
  uint64_t admit_order = 0;     // larger: admitted later (preempted first)
  uint64_t stepped = 0;         // the latest step whose forward included it (Engine::step_id_)
  std::unique_ptr<Sampler> sampler;
  size_t sent = 0;        // bytes of out.text already streamed
  bool reported = false;  // an event of this sample went out
  SampleOutput* out = nullptr;
  // Speculative decoding: this step's drafts, and the coins of the rejection rule (a stream of
  // their own, seeded from the sample's seed, so a seed gives the same tokens every run).
  std::vector<int32_t> drafts;
  int64_t pad = 0;  // rows fed after the drafts only to share a forward (never verified)
  Pcg32 spec_rng{0};
  int64_t needs() const { return static_cast<int64_t>(tokens.size()) - computed; }
  bool scores_prompt() const;  // computes the prompt's logprobs (never from the prefix cache)
};

struct Engine::Request {
  uint64_t id = 0;
  RequestParams params;
  StreamCallback callback;
  Clock::time_point t_submit;
  bool admitted = false, first_token = false, done = false, forked = false;
  bool queued = true;  // counted in Engine::queued_ (from submit until admitted or finished)
  std::vector<std::unique_ptr<Seq>> seqs;  // [n]
  RequestOutput output;
  // output.prompt_logprobs, shared with the samples' first events once every entry is set.
  std::shared_ptr<const std::vector<TokenLogprob>> prompt_scores;
  // The remote tier: the lookup's result (staged at the first admission), and how long the
  // request waits for it.
  RemoteResult remote;
  Clock::time_point remote_deadline;
  KVPolicy policy;      // params.kv_policy, or the engine's
  int64_t spec_k = 0;   // drafts per step at most (params.spec_k resolved; 0: off)
  int64_t context = 0;  // prompt + generated tokens at most (the model's under streaming)
};

// The first sample scores the prompt; the other samples share what it computed (or, when a
// fork found no block, recompute it from the cache like any request).
std::span<const uint8_t> Engine::salt_of(const Request& r) {
  const std::string& salt = r.params.cache_salt;
  return {reinterpret_cast<const uint8_t*>(salt.data()), salt.size()};
}

bool Engine::Seq::scores_prompt() const {
  return index == 0 && req->params.prompt_logprobs >= 0;
}

std::shared_ptr<DiskTier> open_disk_tier(const Model& model, const PagedKVStore& store,
                                         const std::string& dir, uint64_t budget_bytes) {
  DiskTierOptions d;
  d.dir = dir;
  d.budget_bytes = budget_bytes;
  d.block_tokens = store.block_tokens();
  d.fingerprint = Hasher()
                      .str("kvcache disk tier v1")
                      .digest(model_fingerprint(model))
                      .digest(store.layout_digest())
                      .finish();
  return std::make_shared<DiskTier>(d);
}

std::shared_ptr<RemoteTier> open_remote_tier(const Model& model, const Tokenizer* tokenizer,
                                             const PagedKVStore& store,
                                             const EngineConfig& config) {
  RemoteTierOptions o;
  o.make_client = config.kv_remote_client;
  o.block_tokens = store.block_tokens();
  o.deadline_seconds = config.kv_remote_deadline_ms / 1000.0;
  o.max_pending_write_bytes = config.kv_remote_write_budget_bytes;
  // The KV dtype and block_tokens are in the layout digest too; named here as the issue lists
  // what keys must fold.
  o.fingerprint = Hasher()
                      .str("kvcache remote tier v1")
                      .digest(model_fingerprint(model))
                      .digest(tokenizer_fingerprint(tokenizer))
                      .str(dtype_name(store.config().dtype))
                      .i64(store.block_tokens())
                      .digest(store.layout_digest())
                      .finish();
  return std::make_shared<RemoteTier>(std::move(o));
}

PagedPlanOptions engine_plan_options(const Model& model, const EngineConfig& config) {
  const CacheOptions& co = config.cache;
  PagedPlanOptions po;
  po.budget_bytes = config.kv_budget_bytes;
  po.block_tokens = co.paged.block_tokens;
  po.kv_dtype = co.kv_dtype.value_or(DType::kF32);
  po.max_tokens_per_step = config.max_tokens_per_step;
  po.max_cached_tokens = co.max_cache_len > 0 ? co.max_cache_len : kDefaultPoolTokens;
  // Hybrid models: one state slot per running sequence, snapshots for the prefix cache.
  const CacheConfig mcc = model_cache_config(model.config(), co);
  po.linear = mcc.linear;
  // DeepSeek-V4 / V3.2: compressed and indexer pages, K==V pages; compressor state per slot.
  po.compressed = mcc.compressed;
  po.shared_kv = mcc.kv_content == CacheConfig::KVContent::kSharedKV;
  po.linear_slots = config.max_running;
  po.snapshot_every_blocks = co.paged.snapshot_every_blocks;
  po.max_snapshots = co.paged.max_snapshots;
  // Quantized pages: packed full blocks, each running sequence's residual in kv_dtype.
  po.quant = co.paged.quant;
  // Only the eager kernel on unquantized pages copies a sequence's K/V to f32 scratch.
  po.eager_scratch = config.kernel == "eager" && !co.paged.quant;
  // A streaming default: every full group reserves its null block.
  po.streaming = co.policy.kind == KVPolicyKind::kStreaming;
  return po;
}

// A request's policy on this engine's store: Error(kInvalidArgument) saying why it cannot run.
static void check_request_policy(const KVPolicy& p, const PagedKVStore& store,
                                 const std::string& server_policy) {
  if (p.exact()) return;
  if (p.kind != KVPolicyKind::kStreaming)
    throw Error(ErrorKind::kInvalidArgument,
                "request: kv_policy " + p.key() +
                    " chooses tokens per KV head by attention, which blocks shared between "
                    "requests cannot follow; the paged store runs \"exact\" and "
                    "\"streaming:sink=S,window=W\"");
  if (!store.config().streaming)
    throw Error(ErrorKind::kInvalidArgument,
                "request: kv_policy " + p.key() + " on a server started with --kv-policy " +
                    server_policy +
                    ": its pool has no null blocks to stand in for released ones; start the "
                    "server with a streaming --kv-policy to allow streaming requests");
}

Engine::Engine(const Model& model, const Tokenizer* tokenizer, const EngineConfig& config)
    : model_(model), tokenizer_(tokenizer), config_(config) {
  const ModelConfig& mc = model.config();
  const CacheOptions& co = config_.cache;
  if (config_.max_running < 1 || config_.max_tokens_per_step < 1 || co.paged.block_tokens < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "engine: max_running, max_tokens_per_step and cache.paged.block_tokens must be "
                ">= 1");
  // Written so that NaN fails too.
  if (!(config_.safety_margin >= 0 && config_.safety_margin < 1))
    throw Error(ErrorKind::kInvalidArgument,
                "engine: safety_margin (--safety-margin) is a fraction of the blocks in [0, 1), "
                "got " +
                    std::to_string(config_.safety_margin));
  if (config_.scheduler == SchedulerPolicy::kPrefillFirst && config_.safety_margin > 0)
    throw Error(ErrorKind::kInvalidArgument,
                "engine: the safety margin is the fifo scheduler's admission rule; prefill-first "
                "admits while blocks last (drop --safety-margin or use --scheduler fifo)");
  if (co.implementation != "paged" || co.paged.store || co.max_batch_size != 0)
    throw Error(ErrorKind::kInvalidArgument,
                "engine: it serves from a paged store it builds itself, batching max_running "
                "sequences: cache.implementation must be \"paged\", cache.paged.store unset and "
                "cache.max_batch_size 0");
  if (!is_paged_attention_kernel(config_.kernel)) {
    std::string names;
    for (const std::string& k : paged_attention_kernel_names())
      names += (names.empty() ? "" : ", ") + k;
    throw Error(ErrorKind::kInvalidArgument,
                "engine: the attention kernel '" + config_.kernel +
                    "' cannot read paged KV blocks; the paged kernels are " + names);
  }
  if (!co.policy.exact() && co.policy.kind != KVPolicyKind::kStreaming)
    throw Error(ErrorKind::kUnsupported,
                "engine: --kv-policy " + co.policy.key() +
                    " chooses tokens per KV head by attention, which blocks shared between "
                    "requests cannot follow; the paged store runs exact and "
                    "streaming:sink=S,window=W (H2O and SnapKV run in generate's dynamic and "
                    "static caches)");
  kv_policy_ = co.policy.key();
  const PagedPlanOptions po = engine_plan_options(model, config_);
  PagedMemoryPlan plan = plan_paged_memory(mc, po);
  if (po.quant) {
    kv_pages_ = kv_quant_scheme_name(po.quant->scheme);
    if (po.quant->scheme == KVQuantScheme::kKivi) kv_pages_ += "-" + std::to_string(po.quant->bits);
  } else {
    kv_pages_ = dtype_name(po.kv_dtype);
  }
  if (config_.num_blocks > 0) {
    for (int32_t& b : plan.store.group_blocks) b = config_.num_blocks;
    plan.max_cached_tokens =
        static_cast<int64_t>(config_.num_blocks - (po.streaming ? 1 : 0)) * co.paged.block_tokens;
  }
  config_.max_tokens_per_step = plan.max_tokens_per_step;
  max_context_ = std::min<int64_t>(mc.max_seq_len, plan.max_cached_tokens);
  store_ = std::make_shared<PagedKVStore>(plan.store);
  // Only sliding groups: a sequence holds its window (plus a step), whatever its length, so the
  // context is the model's; submit's per-group check refuses a pool too small for one window.
  // Not under the eager kernel: it widens a sequence's whole span (null blocks included) into
  // per-thread f32 scratch, which the plan bills for the pool's tokens only.
  bool bounded = po.eager_scratch;  // some group's blocks (or the eager scratch) grow with length
  for (int g = 0; g < store_->num_groups(); ++g)
    bounded = bounded || store_->group(g).kind != GroupKind::kSliding;
  if (!bounded && store_->num_groups() > 0) max_context_ = mc.max_seq_len;
  if (!config_.kv_disk_dir.empty())
    store_->set_disk_tier(
        open_disk_tier(model, *store_, config_.kv_disk_dir, config_.kv_disk_budget_bytes));
  if (config_.kv_remote_client) {
    if (config_.kv_remote_deadline_ms < 1)
      throw Error(ErrorKind::kInvalidArgument, "engine: kv_remote_deadline_ms must be >= 1");
    std::shared_ptr<RemoteTier> remote = open_remote_tier(model, tokenizer, *store_, config_);
    store_->set_remote_tier(remote);
    remote->set_on_result([this] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        remote_ready_ = true;
      }
      cv_.notify_all();
    });
  }
  for (int g = 0; g < store_->num_groups(); ++g)
    if (store_->group(g).kind == GroupKind::kFull) {
      full_group_ = g;
      break;
    }
  // The layers see the store; a sequence's capacity is what the pool can give one request.
  CacheOptions layers = co;
  layers.policy = KVPolicy{};  // the store evicts per sequence; the layers only read its spans
  layers.max_cache_len = max_context_;
  layers.kv_dtype = po.kv_dtype;
  layers.paged.store = store_;
  cache_ = std::make_unique<Cache>(model_cache_config(mc, std::move(layers)));
  forward_ = std::make_unique<Forward>(
      model, config_.kernel, std::max<int64_t>(config_.max_tokens_per_step, config_.max_running));
  check_spec_config();
  if (config_.spec_k > 0) store_->set_rollback_tokens(config_.spec_k);
  update_metrics();
}

// Speculative decoding rolls rejected drafts back with PagedKVStore::crop, within the
// sequence's last block (propose_drafts): only what that crop restores exactly may run it.
void Engine::check_spec_config() const {
  if (config_.spec_k == 0) return;
  if (config_.spec_k < 0 || config_.spec_ngram < 1)
    throw Error(ErrorKind::kInvalidArgument,
                "engine: --spec-k must be >= 1 and --spec-ngram >= 1, got " +
                    std::to_string(config_.spec_k) + " and " + std::to_string(config_.spec_ngram));
  if (!config_.cache.policy.exact())
    throw Error(ErrorKind::kUnsupported,
                "engine: speculative decoding with --kv-policy " + config_.cache.policy.key() +
                    ": the policy evicts keys, and crop cannot bring them back to roll rejected "
                    "drafts back; use --kv-policy exact or drop --spec");
  // Sliding layers keep, through the store's rollback bound (set in the constructor), the
  // blocks a crop of up to k tokens returns to.
  const std::vector<std::string>& types = cache_->config().layer_types;
  for (size_t l = 0; l < types.size(); ++l)
    if (types[l] != "full_attention" && types[l] != "sliding_attention")
      throw Error(ErrorKind::kUnsupported,
                  "engine: speculative decoding: layer " + std::to_string(l) + " is a " + types[l] +
                      " layer; the paged store rolls back only full-attention and sliding-window "
                      "layers (a recurrent or compressed state keeps no per-token history): drop "
                      "--spec for this model");
  const int64_t bt = store_->block_tokens();
  if (bt < 3)
    throw Error(ErrorKind::kInvalidArgument,
                "engine: speculative decoding keeps a step's drafts inside the sequence's last "
                "block, which needs block_tokens >= 3 (got " +
                    std::to_string(bt) + "); raise the block size or drop --spec");
  if (config_.spec_k + 1 > config_.max_tokens_per_step)
    throw Error(ErrorKind::kInvalidArgument,
                "engine: --spec-k " + std::to_string(config_.spec_k) +
                    " verifies k + 1 tokens per sequence in a step of at most " +
                    std::to_string(config_.max_tokens_per_step) +
                    " tokens (--chunk); lower --spec-k or raise --chunk");
}

Engine::~Engine() {
  // The tier's lookup thread must not wake an engine being destroyed (set_on_result waits for
  // a call in progress).
  if (store_ && store_->remote_tier() != nullptr) {
    store_->remote_tier()->set_on_result(nullptr);
    // The blocks queued for writing go out (each batch bounded by its deadline; dropped at
    // once while the breaker is open), so that a batch run's cache outlives it.
    store_->remote_tier()->flush();
  }
  // The prefix cache still in RAM goes to the disk tier too, so that the next start with the
  // same directory hits on all of it, not only on what was evicted.
  if (store_ && store_->disk_tier() != nullptr) {
    try {
      store_->spill_to_disk();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "engine: the prefix cache was not written to the disk tier: %s\n",
                   e.what());
    }
  }
}

uint64_t Engine::submit(RequestParams params, StreamCallback callback) {
  const int64_t vocab = model_.config().vocab_size;
  if (params.prompt.empty())
    throw Error(ErrorKind::kInvalidArgument, "request: the prompt is empty");
  for (int32_t id : params.prompt)
    if (id < 0 || id >= vocab)
      throw Error(ErrorKind::kInvalidArgument, "request: prompt token id " + std::to_string(id) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(vocab) + ")");
  if (params.max_tokens < 0)
    throw Error(ErrorKind::kInvalidArgument, "request: max_tokens must be >= 0");
  if (params.cache_salt.size() > kMaxCacheSalt)
    throw Error(ErrorKind::kInvalidArgument,
                "request: cache_salt is " + std::to_string(params.cache_salt.size()) +
                    " bytes; at most " + std::to_string(kMaxCacheSalt) + " are accepted");
  if (params.n < 1 || params.n > config_.max_running)
    throw Error(ErrorKind::kInvalidArgument,
                "request: n must be in [1, " + std::to_string(config_.max_running) + "]");
  const KVPolicy policy = params.kv_policy.value_or(config_.cache.policy);
  if (params.kv_policy) params.kv_policy->validate();
  check_request_policy(policy, *store_, kv_policy_);
  // A streaming sequence holds its sinks, its window and a step, not its length: its context is
  // the model's (positions past it were never trained).
  const int64_t context = policy.exact() ? max_context_ : model_.config().max_seq_len;
  // Written so that no sum can overflow (max_tokens near 2^63 is a client's value).
  if (static_cast<int64_t>(params.prompt.size()) > context ||
      params.max_tokens > context - static_cast<int64_t>(params.prompt.size()))
    throw Error(ErrorKind::kInvalidArgument,
                "request: prompt (" + std::to_string(params.prompt.size()) +
                    " tokens) + max_tokens (" + std::to_string(params.max_tokens) +
                    ") exceeds the context of " + std::to_string(context) +
                    " tokens; shorten the prompt or lower max_tokens");
  check_group_capacity(static_cast<int64_t>(params.prompt.size()) + params.max_tokens, policy);
  if (params.logprobs < -1 || params.logprobs > kMaxTopLogprobs)
    throw Error(ErrorKind::kInvalidArgument,
                "request: logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                    "] (or -1: none), got " + std::to_string(params.logprobs));
  if (params.prompt_logprobs < -1 || params.prompt_logprobs > kMaxTopLogprobs)
    throw Error(ErrorKind::kInvalidArgument,
                "request: prompt_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                    "] (or -1: none), got " + std::to_string(params.prompt_logprobs));
  if (!params.stop_strings.empty() && tokenizer_ == nullptr)
    throw Error(ErrorKind::kInvalidArgument, "request: stop strings need a tokenizer");
  if (params.spec_k < -1 || params.spec_k > config_.spec_k)
    throw Error(ErrorKind::kInvalidArgument,
                config_.spec_k == 0
                    ? "request: speculative k " + std::to_string(params.spec_k) +
                          " on a server started without --spec; start it with --spec ngram"
                    : "request: speculative k must be in [0, " + std::to_string(config_.spec_k) +
                          "] (the server's --spec-k; 0: off), got " +
                          std::to_string(params.spec_k));
  const int64_t spec_k = params.spec_k < 0 ? config_.spec_k : params.spec_k;
  if (spec_k > 0 && !policy.exact())
    throw Error(ErrorKind::kInvalidArgument,
                "request: kv_policy " + policy.key() +
                    " evicts keys, which speculative decoding's rollback needs; set speculative "
                    "k to 0 or use an exact policy");
  for (const std::string& s : params.stop_strings)
    if (s.empty()) throw Error(ErrorKind::kInvalidArgument, "request: empty stop string");

  auto r = std::make_unique<Request>();
  r->params = std::move(params);
  r->callback = std::move(callback);
  r->t_submit = Clock::now();
  const int32_t n = r->params.n;
  r->output.samples.resize(static_cast<size_t>(n));
  r->output.stats.prompt_tokens = static_cast<int64_t>(r->params.prompt.size());
  r->output.stats.kv_pages = kv_pages_;
  r->policy = policy;
  r->spec_k = spec_k;
  r->output.stats.speculative = spec_k > 0;
  r->context = context;
  r->output.stats.kv_policy = policy.key();
  if (r->params.prompt_logprobs >= 0) r->output.prompt_logprobs.resize(r->params.prompt.size() - 1);
  for (int32_t i = 0; i < n; ++i) {
    auto s = std::make_unique<Seq>();
    s->req = r.get();
    s->index = i;
    s->state = i == 0 ? SeqState::kWaiting : SeqState::kPendingFork;
    s->tokens = r->params.prompt;
    SamplerParams sp = r->params.sampler;
    sp.seed += static_cast<uint64_t>(i);
    s->sampler = std::make_unique<Sampler>(sp, model_.config().vocab_size);
    s->spec_rng = Pcg32(sp.seed, 0x2545f4914f6cdd1dull);
    s->out = &r->output.samples[static_cast<size_t>(i)];
    r->seqs.push_back(std::move(s));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (queued_ >= config_.max_waiting) return 0;
  r->id = next_id_++;
  r->output.id = r->id;
  const uint64_t id = r->id;
  inbox_.push_back(std::move(r));
  ++queued_;
  cv_.notify_all();
  return id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

bool Engine::has_work() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !inbox_.empty() || !cancels_.empty() || !requests_.empty() || !tasks_.empty();
}

void Engine::wait_for_work(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
    return !inbox_.empty() || !cancels_.empty() || !requests_.empty() || !tasks_.empty();
  });
}

void Engine::notify() {
  cv_.notify_all();
}

void Engine::post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
}

std::vector<int32_t> Engine::finished_tokens(uint64_t id, bool* salted, std::string* policy) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Finished& f : finished_) {
    if (f.id != id) continue;
    if (salted != nullptr) *salted = f.salted;
    if (policy != nullptr) *policy = f.policy;
    return f.tokens;
  }
  return {};
}

std::map<std::string, int64_t> Engine::requests_by_kv_policy() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_by_policy_;
}

void Engine::drain_inbox() {
  std::vector<std::unique_ptr<Request>> incoming;
  std::vector<uint64_t> cancels;
  std::vector<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    incoming.swap(inbox_);
    cancels.swap(cancels_);
    tasks.swap(tasks_);
  }
  for (auto& task : tasks) task();  // between steps: no forward, no open store step
  for (auto& r : incoming) {
    if (store_->remote_tier() != nullptr && start_remote_lookup(*r))
      remote_wait_.push_back(r->seqs[0].get());
    else
      waiting_.push_back(r->seqs[0].get());
    requests_.push_back(std::move(r));
  }
  poll_remote();
  for (uint64_t id : cancels) {
    for (auto& r : requests_) {
      if (r->id != id || r->done) continue;
      for (auto& s : r->seqs)
        if (s->state != SeqState::kFinished) finish_seq(*s, FinishReason::kCancelled);
    }
  }
}

bool Engine::start_remote_lookup(Request& r) {
  Seq& s = *r.seqs[0];
  if (s.scores_prompt()) return false;  // computed whole: no prefix hit to extend
  const std::span<const int32_t> tokens = r.params.prompt;
  const std::span<const uint8_t> salt = salt_of(r);
  const int64_t bt = store_->block_tokens();
  const int64_t nj = (static_cast<int64_t>(tokens.size()) - 1) / bt;  // full blocks, last excluded
  const int64_t local = store_->match_prefix_with_disk(tokens, salt, r.policy) / bt;
  if (local >= nj) return false;
  std::vector<std::vector<BlockKey>> keys = store_->prefix_block_keys(tokens, salt, r.policy);
  RemoteLookup req;
  req.id = r.id;
  req.first_block = local;
  for (int g = 0; g < store_->num_groups(); ++g) {
    std::vector<BlockKey>& k = keys[static_cast<size_t>(g)];
    req.keys.emplace_back(k.empty() ? k.end() : k.begin() + local, k.end());
    req.payload_bytes.push_back(store_->block_payload_bytes(g));
  }
  req.tokens.assign(tokens.begin() + local * bt, tokens.begin() + nj * bt);
  uint64_t block_bytes = 0;
  for (size_t g = 0; g < req.keys.size(); ++g)
    if (!req.keys[g].empty()) block_bytes += req.payload_bytes[g];
  // The lookup thread serves lookups one by one: a request waits for its own calls (one
  // deadline each: RemoteTierOptions::lookup_chunk_bytes), one more deadline of queueing and
  // 10 ms, then goes on with local compute.
  const int64_t calls = store_->remote_tier()->options().lookup_calls(nj - local, block_bytes);
  const auto wait = std::chrono::milliseconds((calls + 1) * config_.kv_remote_deadline_ms + 10);
  r.remote_deadline = Clock::now() + wait;
  store_->remote_tier()->lookup(std::move(req));
  return true;
}

void Engine::poll_remote() {
  if (store_->remote_tier() == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    remote_ready_ = false;
  }
  std::vector<RemoteResult> results = store_->remote_tier()->take_results();
  const Clock::time_point now = Clock::now();
  for (auto it = remote_wait_.begin(); it != remote_wait_.end();) {
    Request& r = *(*it)->req;
    bool ready = false;
    for (RemoteResult& res : results)
      if (res.id == r.id) {
        r.remote = std::move(res);
        res.id = 0;
        ready = true;
      }
    if (!ready && now >= r.remote_deadline) {
      ready = true;  // a late result is dropped when it comes (no request takes its id)
      ++counters_.remote_waits_expired;
    }
    if (ready) {
      waiting_.push_back(*it);
      it = remote_wait_.erase(it);
    } else {
      ++it;
    }
  }
}

// The most blocks of each group one request holds at once (transformers v5 sizes a sliding
// group the same way: generation/continuous_batching/cache_manager.py,
// SlidingAttentionCacheAllocator, at most ceil(sliding_window / block_size) blocks per request).
// Here a step of c tokens at position p keeps the keys [p - W + 1, p + c) of a sliding group,
// W - 1 + c tokens (sliding_blocks): a decode (c = 1) the window's blocks plus one, a prefill
// chunk (c <= max_tokens_per_step) more, over any chunking the budget may give (a preempted
// sequence recomputes in other chunks). A streaming request's full groups likewise keep its
// sinks' blocks and its window (bounded there by the same span at its worst alignment). The
// pool must hold that much for the request alone, else it could never run (and would preempt
// itself forever).
void Engine::check_group_capacity(int64_t tokens, const KVPolicy& policy) const {
  const int64_t bt = store_->block_tokens();
  const int64_t chunk = std::min(tokens, config_.max_tokens_per_step);
  const auto window_blocks = [&](int64_t window) {
    return std::min(ceil_div(tokens, bt), ceil_div(window - 1 + chunk, bt) + 1);
  };
  for (int g = 0; g < store_->num_groups(); ++g) {
    const PagedGroup& grp = store_->group(g);
    int64_t need = 0;
    std::string what;
    switch (grp.kind) {
      case GroupKind::kFull:
        what = "full attention";
        need = ceil_div(tokens, bt);
        if (!policy.exact())  // streaming: the sinks' blocks stay, the window slides
          need = std::min(need, ceil_div(policy.sink, bt) + window_blocks(policy.window));
        break;
      case GroupKind::kSliding:
        what = "sliding window " + std::to_string(grp.window);
        // A rollback bound r (speculative decoding) keeps what a query r positions back sees:
        // the blocks of a window r tokens longer.
        need = sliding_blocks(tokens, grp.window + store_->rollback_tokens(), chunk, bt);
        break;
      case GroupKind::kCompressed:  // floor(tokens / rate) entries, block_tokens per block
        what = "compressed, rate " + std::to_string(grp.rate);
        need = ceil_div(tokens / grp.rate, bt);
        break;
    }
    const int64_t have = store_->pool(g).num_blocks() - (store_->has_null_block(g) ? 1 : 0);
    if (need > have)
      throw Error(ErrorKind::kInvalidArgument,
                  "request: prompt + max_tokens (" + std::to_string(tokens) + " tokens) need " +
                      std::to_string(need) + " blocks of " + std::to_string(bt) +
                      " tokens at once in layer group " + std::to_string(g) + " (" + what +
                      "), which has " + std::to_string(have) +
                      "; shorten the prompt, lower max_tokens or give the cache more blocks");
  }
}

// v5's FIFOScheduler compares the free blocks with safety_margin x num_blocks; cached blocks
// count as free here, as there (BlockManager::num_free_blocks counts initialized blocks).
bool Engine::outside_safety_margin() const {
  if (config_.safety_margin <= 0) return false;
  for (int g = 0; g < store_->num_groups(); ++g) {
    const BlockPool& pool = store_->pool(g);
    const int32_t blocks = pool.num_blocks() - (store_->has_null_block(g) ? 1 : 0);
    if (static_cast<double>(pool.num_available()) < config_.safety_margin * blocks) return true;
  }
  return false;
}

Engine::Seq* Engine::newest_running() {
  Seq* best = nullptr;
  for (Seq* s : running_)
    if (best == nullptr || s->admit_order > best->admit_order) best = s;
  return best;
}

void Engine::preempt(Seq& s) {
  KV_CHECK(s.state == SeqState::kRunning, "preempt: not running");
  store_->free_sequence(s.sid);
  s.sid = -1;
  s.computed = 0;
  s.state = SeqState::kWaiting;
  running_.erase(std::find(running_.begin(), running_.end(), &s));
  waiting_.push_front(&s);
  ++s.req->output.stats.preemptions;
  ++counters_.preemptions;
}

Engine::ChunkStatus Engine::run_chunk(Seq& s, int64_t n) {
  if (!plan_chunk(s, n)) return ChunkStatus::kOutOfBlocks;
  return forward_chunk(s, n) ? ChunkStatus::kOk : ChunkStatus::kFailed;
}

bool Engine::plan_chunk(Seq& s, int64_t n) {
  const SeqId one[1] = {s.sid};
  store_->set_batch(one);
  const std::span<const int32_t> ids(s.tokens.data() + s.computed, static_cast<size_t>(n));
  return store_->plan_step(n, ids) == StepStatus::kOk;
}

bool Engine::forward_chunk(Seq& s, int64_t n) {
  const std::span<const int32_t> ids(s.tokens.data() + s.computed, static_cast<size_t>(n));
  const bool last = s.computed + n == static_cast<int64_t>(s.tokens.size());
  const int64_t pos[1] = {s.computed};
  ForwardParams p;
  p.tokens = ids.data();
  p.batch = 1;
  p.n_tokens = n;
  p.pos0 = s.computed;
  p.row_pos0 = pos;
  p.cache = cache_.get();
  // Positions [computed, computed + n) predict tokens computed + 1 ...: the prompt's scores
  // need every row's logits while a prompt token is left to score.
  const auto prompt_size = static_cast<int64_t>(s.req->params.prompt.size());
  const bool score = s.scores_prompt() && s.computed < prompt_size - 1;
  p.logits = score ? LogitsMode::kAll : last ? LogitsMode::kLast : LogitsMode::kNone;
  p.batch_invariant = config_.batch_invariant;
  Seq* const one[1] = {&s};
  std::span<const float> logits;
  if (!forward_contained(p, one, logits)) return false;
  const auto V = static_cast<size_t>(model_.config().vocab_size);
  if (score) {
    try {
      std::vector<TokenLogprob>& out = s.req->output.prompt_logprobs;
      const int32_t k = s.req->params.prompt_logprobs;
      for (int64_t j = 0; j < n && s.computed + j + 1 < prompt_size; ++j) {
        const auto at = static_cast<size_t>(s.computed + j);
        out[at] = named_logprob(logits.subspan(static_cast<size_t>(j) * V, V),
                                s.req->params.prompt[at + 1], k);
      }
      if (s.computed + n >= prompt_size - 1)  // scored whole: the samples' first events carry it
        s.req->prompt_scores = std::make_shared<const std::vector<TokenLogprob>>(out);
    } catch (const std::exception& e) {
      fail_request(*s.req, RequestErrorKind::kEngine,
                   std::string("scoring the prompt failed: ") + describe(e));
      check_after_failure("scoring a prompt");
      return true;  // the forward itself went through
    }
  }
  s.computed += n;
  counters_.computed_prompt_tokens += n;
  if (last) sample_contained(s, score ? logits.subspan(static_cast<size_t>(n - 1) * V, V) : logits);
  return true;
}

bool Engine::forward_contained(const ForwardParams& p, std::span<Seq* const> seqs,
                               std::span<const float>& logits) {
  step_ran_ = true;
  for (Seq* s : seqs) s->stepped = step_id_;
  try {
    logits = forward_->forward(p);
  } catch (const std::exception& e) {
    const std::string why = describe(e);
    store_->abort_step();
    ++counters_.failed_forwards;
    ++counters_.consecutive_failed_forwards;
    counters_.last_error = why;
    std::vector<Request*> reqs;
    for (Seq* s : seqs)
      if (std::find(reqs.begin(), reqs.end(), s->req) == reqs.end()) reqs.push_back(s->req);
    const std::string message = "the model's forward (" + std::to_string(p.batch) + " x " +
                                std::to_string(p.n_tokens) + " tokens) failed: " + why;
    std::fprintf(stderr, "kvcache engine: %s; failing %zu request(s)\n", message.c_str(),
                 reqs.size());
    for (Request* r : reqs) fail_request(*r, RequestErrorKind::kEngine, message);
    check_after_failure("a failed forward");
    return false;
  }
  ++counters_.forwards;
  counters_.consecutive_failed_forwards = 0;
  return true;
}

void Engine::sample_contained(Seq& s, std::span<const float> logits) {
  if (s.state != SeqState::kRunning) return;  // a sibling's failure ended the request
  try {
    after_logits(s, logits);
  } catch (const std::exception& e) {
    fail_request(*s.req, RequestErrorKind::kEngine,
                 std::string("sampling or detokenizing failed: ") + describe(e));
    check_after_failure("a failed sample");
  }
}

void Engine::fail_request(Request& r, RequestErrorKind kind, const std::string& message) {
  if (r.done) return;
  if (r.output.error.empty()) {
    r.output.error = message;
    r.output.error_kind = kind;
  }
  ++counters_.requests_failed;
  for (auto& q : r.seqs)
    if (q->state != SeqState::kFinished) finish_seq(*q, FinishReason::kError);
}

void Engine::check_after_failure(const std::string& what) {
  const std::string inv = check_invariants();
  if (!inv.empty()) fatal("after " + what + " the KV cache is inconsistent: " + inv);
}

void Engine::invoke_callback(Request& r, const StreamEvent& ev) {
  if (!r.callback) return;
  try {
    r.callback(ev);
  } catch (const std::exception& e) {  // the caller's code: the engine's state is unknown now
    fatal("the stream callback of request " + std::to_string(r.id) + " threw: " + e.what());
  }
}

void Engine::run_decodes(int64_t& budget) {
  step_seqs_.clear();
  for (Seq* s : running_)
    // Prefill-first: a sequence whose prefill ended in this step decodes from the next one.
    if (s->needs() == 1 && s->stepped != step_id_ &&
        static_cast<int64_t>(step_seqs_.size()) < budget)
      step_seqs_.push_back(s);
  if (step_seqs_.empty()) return;
  // Speculative decoding: drafts take the budget the decodes leave, oldest sequence first; a
  // sequence then runs 1 + drafts rows. One forward per row count (rows of one forward are
  // equally long), fewest rows first: without drafts, one forward as before.
  int64_t spare = budget - static_cast<int64_t>(step_seqs_.size());
  int64_t most = 1;
  for (Seq* s : step_seqs_) {
    propose_drafts(*s, spare);
    spare -= static_cast<int64_t>(s->drafts.size());
    most = std::max(most, static_cast<int64_t>(s->drafts.size()) + 1);
  }
  // Every forward reads all the weights: a sequence with fewer drafts than the most is padded
  // (its last draft repeated) to `most` rows where its block and the budget leave room, so that
  // the drafting sequences share one forward. Padded rows are written and cropped, never
  // verified (they are no drafts: not counted, never emitted).
  for (Seq* s : step_seqs_) {
    s->pad = 0;
    const auto m = static_cast<int64_t>(s->drafts.size());
    if (m == 0 || m + 1 == most) continue;
    const int64_t pad = most - 1 - m;
    if (pad <= spare &&
        draft_room(s->computed, s->req->context, store_->block_tokens()) >= most - 1) {
      s->pad = pad;
      spare -= pad;
    }
  }
  const std::vector<Seq*> decodes = step_seqs_;
  for (int64_t n = 1; n <= most; ++n) {
    spec_group_.clear();
    for (Seq* s : decodes)  // preempted ones (no longer running) drop out
      if (s->state == SeqState::kRunning &&
          static_cast<int64_t>(s->drafts.size()) + s->pad + 1 == n)
        spec_group_.push_back(s);
    run_decode_group(spec_group_, n, budget);
  }
}

void Engine::run_decode_group(std::vector<Seq*>& group, int64_t n, int64_t& budget) {
  while (!group.empty()) {
    batch_.clear();
    step_tokens_.clear();
    row_pos_.clear();
    for (Seq* s : group) {
      batch_.push_back(s->sid);
      step_tokens_.push_back(s->tokens.back());
      step_tokens_.insert(step_tokens_.end(), s->drafts.begin(), s->drafts.end());
      step_tokens_.insert(step_tokens_.end(), static_cast<size_t>(s->pad),
                          s->drafts.empty() ? s->tokens.back() : s->drafts.back());
      row_pos_.push_back(s->computed);
    }
    store_->set_batch(batch_);
    if (store_->plan_step(n, step_tokens_) == StepStatus::kOk) break;
    Seq* victim = newest_running();
    preempt(*victim);
    group.erase(std::remove(group.begin(), group.end(), victim), group.end());
  }
  if (group.empty()) return;
  const auto B = static_cast<int64_t>(group.size());
  ForwardParams p;
  p.tokens = step_tokens_.data();
  p.batch = B;
  p.n_tokens = n;
  p.pos0 = row_pos_[0];
  p.row_pos0 = row_pos_.data();
  p.cache = cache_.get();
  p.logits = n == 1 ? LogitsMode::kLast : LogitsMode::kAll;  // drafts: every row's verdict
  p.batch_invariant = config_.batch_invariant;
  budget -= B * n;
  std::span<const float> logits;
  if (!forward_contained(p, group, logits)) return;
  const auto V = static_cast<size_t>(model_.config().vocab_size);
  const auto rows = static_cast<size_t>(n) * V;
  for (size_t i = 0; i < group.size(); ++i) {
    if (n == 1) {
      group[i]->computed += 1;
      sample_contained(*group[i], logits.subspan(i * V, V));
    } else {
      verify_contained(*group[i], logits.subspan(i * rows, rows));
    }
  }
}

void Engine::continue_prefills(int64_t& budget) {
  step_seqs_.clear();
  for (Seq* s : running_)
    if (s->needs() > 1) step_seqs_.push_back(s);
  for (Seq* s : step_seqs_) {
    if (budget <= 0) return;
    if (s->state != SeqState::kRunning) continue;  // preempted meanwhile
    // Hybrid chunks stop at snapshot boundaries: the sequence goes on while the budget lasts.
    do {
      const int64_t n = hybrid_chunk(*s, budget);
      if (n == 0) break;  // its segment waits for a step with room for it
      ChunkStatus st = run_chunk(*s, n);
      while (st == ChunkStatus::kOutOfBlocks) {
        Seq* victim = newest_running();
        preempt(*victim);
        if (victim == s) break;
        st = run_chunk(*s, n);
      }
      if (st == ChunkStatus::kOutOfBlocks) break;
      budget -= n;  // a failed chunk spent its time too
      if (st == ChunkStatus::kFailed) break;
    } while (store_->has_linear() && budget > 0 && s->state == SeqState::kRunning &&
             s->needs() > 1);
  }
}

// New (or preempted) sequences, while the budget and the blocks last: runs of equal uncached
// lengths batched, the rest one by one. FIFO's safety margin is checked before each admission
// (a batch counts as one), as v5 checks it before each scheduled request.
void Engine::admit_waiting(int64_t& budget) {
  if (budget <= 0 || (step_ran_ && outside_safety_margin())) return;
  admit_batched(budget);
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < config_.max_running) {
    if (step_ran_ && outside_safety_margin()) return;
    Seq* s = waiting_.front();
    Request& r = *s->req;
    s->sid = store_->add_sequence(salt_of(r), r.policy);
    // A remote lookup's blocks go to the first attach (after it they are cached in RAM).
    if (r.remote.blocks > 0) store_->stage_remote(std::move(r.remote));
    r.remote = RemoteResult{};
    s->computed = s->scores_prompt() ? 0 : store_->attach_prefix(s->sid, s->tokens);
    store_->clear_remote_stage();
    s->computed_disk = s->computed > 0 ? store_->last_prefix_disk_tokens() : 0;
    s->computed_remote = s->computed > 0 ? store_->last_prefix_remote_tokens() : 0;
    const int64_t n = hybrid_chunk(*s, budget);
    if (n == 0) {  // a hybrid segment that waits for a step with room: it stays first
      store_->free_sequence(s->sid);
      s->sid = -1;
      s->computed = 0;
      return;
    }
    if (!plan_chunk(*s, n)) {  // the uncached tail does not fit now: it stays first in the queue
      store_->free_sequence(s->sid);
      s->sid = -1;
      s->computed = 0;
      // Alone and still too big: it can never run. (submit's per-group check refuses the
      // requests that cannot fit any pool; this catches what it cannot see, e.g. the blocks a
      // streaming request's sinks keep.)
      if (running_.empty())
        fail_request(r, RequestErrorKind::kCapacity,
                     "the request needs more KV blocks than the cache has (" +
                         std::to_string(s->tokens.size()) +
                         " tokens); shorten the prompt or lower max_tokens");
      return;
    }
    // Planned: admitted now, before the forward, which may finish the request (max_tokens 1)
    // and must find its admission counted.
    waiting_.pop_front();
    s->state = SeqState::kRunning;
    s->admit_order = ++admit_counter_;
    running_.push_back(s);
    note_admitted(*s, s->computed);
    budget -= n;
    forward_chunk(*s, n);
  }
}

// The tokens of s's next prefill chunk within `budget`; 0: wait for the next step.
// Other models: as many as fit. Hybrid models: the store can snapshot the linear layers' state
// only where a forward ends, and the chunked delta rule's bits depend on where a prefill is
// split; so a chunk is a whole segment — from the position to the next snapshot boundary (a
// multiple of snapshot_every_blocks blocks, counted from position 0) or to the end of the
// tokens: every boundary gets its snapshot and the chunking is a function of the positions
// alone, the same whether the prompt started from a prefix hit or from 0, batched or alone. A
// segment that does not fit the budget left waits for a later step when a step can always
// hold it (max_tokens_per_step minus max_running decodes: the oldest prefilling sequence,
// served first, then always progresses); a longer one is cut to the budget.
int64_t Engine::hybrid_chunk(const Seq& s, int64_t budget) const {
  const int64_t n = std::min(s.needs(), budget);
  if (!store_->has_linear()) return n;
  const PagedStoreConfig& sc = store_->config();
  int64_t end = static_cast<int64_t>(s.tokens.size());
  if (sc.max_snapshots > 0) {
    const int64_t every = static_cast<int64_t>(sc.snapshot_every_blocks) * sc.block_tokens;
    end = std::min(end, (s.computed / every + 1) * every);
  }
  const int64_t segment = end - s.computed;
  if (segment <= budget) return segment;
  if (segment <= config_.max_tokens_per_step - config_.max_running) return 0;
  return n;
}

void Engine::note_admitted(Seq& s, int64_t matched) {
  Request& r = *s.req;
  if (r.admitted) return;
  r.admitted = true;
  const auto prompt = static_cast<int64_t>(r.params.prompt.size());
  r.output.stats.cached_tokens = std::min(matched, prompt);
  r.output.stats.cached_tokens_disk = std::min(s.computed_disk, r.output.stats.cached_tokens);
  r.output.stats.cached_tokens_remote =
      std::min(s.computed_remote, r.output.stats.cached_tokens - r.output.stats.cached_tokens_disk);
  r.output.stats.queue_seconds = seconds_since(r.t_submit);
  counters_.prompt_tokens += prompt;
  counters_.cached_prompt_tokens += r.output.stats.cached_tokens;
  counters_.cached_prompt_tokens_disk += r.output.stats.cached_tokens_disk;
  counters_.cached_prompt_tokens_remote += r.output.stats.cached_tokens_remote;
  leave_queue(r);
}

void Engine::leave_queue(Request& r) {
  if (!r.queued) return;
  r.queued = false;
  std::lock_guard<std::mutex> lock(mu_);
  --queued_;
}

// Waiting sequences at the front of the queue whose uncached tails have the same length n and
// fit the budget whole are admitted together and prefilled as ONE forward of k rows x n tokens
// (each row at its own position through the paged cache) instead of k forwards: a burst of
// arrivals then reads the weights once, not once per sequence, and reaches its first tokens
// together. Results do not change: in batch-invariant mode every linear's row is computed as
// if alone (matmul's GEMV contract) and each row attends only to its own sequence. Members of
// one batch cannot hit on each other's blocks (all are written in the same forward), whereas
// one by one a later sequence reuses the prompt blocks an earlier one just wrote: so the batch
// stops at a candidate whose first full block equals an earlier member's (a shared system
// prompt), and that one goes the one-by-one path after the batch has keyed its blocks. The
// one-by-one path also takes everything else (a single candidate, out of blocks) and preempts.
void Engine::admit_batched(int64_t& budget) {
  step_seqs_.clear();
  // Hybrid models: a batched prefill takes each tail whole, past the block boundaries where
  // the linear layers' state must be snapshotted for the prefix cache; one by one, chunks end
  // there (hybrid_chunk).
  if (store_->has_linear()) return;
  int64_t n = 0;
  const auto bt = static_cast<size_t>(config_.cache.paged.block_tokens);
  auto shares_first_block = [&](const Seq& s) {
    if (s.tokens.size() < bt) return false;
    for (const Seq* o : step_seqs_)
      if (o->tokens.size() >= bt &&
          std::equal(s.tokens.begin(), s.tokens.begin() + bt, o->tokens.begin()))
        return true;
    return false;
  };
  for (Seq* s : waiting_) {
    if (static_cast<int64_t>(running_.size() + step_seqs_.size()) >= config_.max_running) break;
    if (s->scores_prompt()) break;  // needs every row's logits: the one-by-one path
    // Blocks staged from the remote tier are loaded by the one-by-one path's attach.
    if (s->req->remote.blocks > 0) break;
    // Full blocks only: a copied tail takes a block at attach time, which could evict a cached
    // block a later candidate's match counted on (the one-by-one path copies tails).
    const int64_t ram = store_->match_prefix(
        s->tokens, salt_of(*s->req), PagedKVStore::PrefixMatch::kFullBlocks, s->req->policy);
    // A prefix the disk tier extends is loaded at attach time (allocating blocks): the
    // one-by-one path takes it, so that the batch's matches cannot change under it.
    if (store_->disk_tier() != nullptr &&
        store_->match_prefix_with_disk(s->tokens, salt_of(*s->req), s->req->policy) > ram)
      break;
    const int64_t need = static_cast<int64_t>(s->tokens.size()) - ram;
    if (step_seqs_.empty()) n = need;
    if (need != n || static_cast<int64_t>(step_seqs_.size() + 1) * n > budget ||
        shares_first_block(*s))
      break;
    step_seqs_.push_back(s);
  }
  if (step_seqs_.size() < 2) return;
  batch_.clear();
  step_tokens_.clear();
  row_pos_.clear();
  for (Seq* s : step_seqs_) {
    s->sid = store_->add_sequence(salt_of(*s->req), s->req->policy);
    s->computed = store_->attach_prefix(s->sid, s->tokens, PagedKVStore::PrefixMatch::kFullBlocks);
    s->computed_disk = s->computed > 0 ? store_->last_prefix_disk_tokens() : 0;
    s->computed_remote = 0;
    KV_CHECK(s->needs() == n, "admit_batched: the prefix match changed between match and attach");
    batch_.push_back(s->sid);
    step_tokens_.insert(step_tokens_.end(), s->tokens.begin() + s->computed, s->tokens.end());
    row_pos_.push_back(s->computed);
  }
  store_->set_batch(batch_);
  if (store_->plan_step(n, step_tokens_) != StepStatus::kOk) {
    for (Seq* s : step_seqs_) {  // nothing was planned: undo the attachments
      store_->free_sequence(s->sid);
      s->sid = -1;
      s->computed = 0;
    }
    return;
  }
  for (Seq* s : step_seqs_) {
    KV_CHECK(waiting_.front() == s, "admit_batched: candidates are the front of the queue");
    waiting_.pop_front();
    s->state = SeqState::kRunning;
    s->admit_order = ++admit_counter_;
    running_.push_back(s);
    note_admitted(*s, s->computed);
  }
  const auto B = static_cast<int64_t>(step_seqs_.size());
  budget -= B * n;
  ForwardParams p;
  p.tokens = step_tokens_.data();
  p.batch = B;
  p.n_tokens = n;
  p.pos0 = row_pos_[0];
  p.row_pos0 = row_pos_.data();
  p.cache = cache_.get();
  p.logits = LogitsMode::kLast;  // every tail is whole: each row's last token samples
  p.batch_invariant = config_.batch_invariant;
  std::span<const float> logits;
  if (!forward_contained(p, step_seqs_, logits)) return;
  const auto V = static_cast<size_t>(model_.config().vocab_size);
  for (size_t i = 0; i < step_seqs_.size(); ++i) {
    step_seqs_[i]->computed += n;
    counters_.computed_prompt_tokens += n;
    sample_contained(*step_seqs_[i], logits.subspan(i * V, V));
  }
}

void Engine::fork_samples(Seq& parent) {
  Request& r = *parent.req;
  r.forked = true;
  const int n_children = r.params.n - 1;
  // Forked children run at once: only as many as --max-running leaves room for; the others
  // wait and recompute from the prompt's cached blocks.
  const int room = std::max(0, config_.max_running - static_cast<int>(running_.size()));
  const int n_forked = std::min(n_children, room);
  std::vector<SeqId> children;
  const bool forked = n_forked > 0 && store_->fork(parent.sid, n_forked, children);
  for (int i = 1; i <= n_children; ++i) {
    Seq& c = *r.seqs[static_cast<size_t>(i)];
    if (c.state != SeqState::kPendingFork) continue;
    c.tokens = parent.tokens;
    if (forked &&
        i <= n_forked) {  // shares the prompt's blocks; samples from the parent's logits below
      c.sid = children[static_cast<size_t>(i - 1)];
      c.computed = parent.computed;
      c.state = SeqState::kRunning;
      c.admit_order = ++admit_counter_;
      running_.push_back(&c);
    } else {  // no block for the copied tail: recompute later (the prompt's full blocks are cached)
      c.state = SeqState::kWaiting;
      waiting_.push_front(&c);
    }
  }
}

TokenLogprob Engine::named_logprob(std::span<const float> logits, int32_t token, int32_t k) const {
  TokenLogprob lp = token_logprob(logits, token, k);
  lp.chosen.piece = logprob_piece(tokenizer_, lp.chosen.token);
  for (LogprobEntry& e : lp.top) e.piece = logprob_piece(tokenizer_, e.token);
  return lp;
}

void Engine::after_logits(Seq& s, std::span<const float> logits) {
  Request& r = *s.req;
  if (r.params.max_tokens == 0) {  // the prompt only (scored, most likely): nothing to sample
    for (auto& q : r.seqs)
      if (q->state != SeqState::kFinished) finish_seq(*q, FinishReason::kLength);
    return;
  }
  if (r.params.n > 1 && !r.forked) {
    fork_samples(s);
    for (auto& c : r.seqs)
      if (c.get() != &s && c->state == SeqState::kRunning && c->computed == s.computed &&
          c->needs() == 0)
        after_logits(*c, logits);
  }
  emit_token(s, logits, s.sampler->sample(logits, s.tokens));
}

bool Engine::emit_token(Seq& s, std::span<const float> logits, int32_t tok) {
  Request& r = *s.req;
  if (!r.first_token) {
    r.first_token = true;
    r.output.stats.ttft_seconds = seconds_since(r.t_submit);
  }
  ++counters_.generation_tokens;
  if (std::find(r.params.stop_ids.begin(), r.params.stop_ids.end(), tok) !=
      r.params.stop_ids.end()) {
    finish_seq(s, FinishReason::kStop);
    return false;
  }
  std::optional<TokenLogprob> lp;
  if (r.params.logprobs >= 0) {
    lp = named_logprob(logits, tok, r.params.logprobs);
    s.out->logprobs.push_back(*lp);
  }
  s.tokens.push_back(tok);
  s.out->tokens.push_back(tok);
  ++r.output.stats.completion_tokens;
  emit_text(s, tok, std::move(lp));
  if (s.state == SeqState::kFinished) return false;
  if (static_cast<int64_t>(s.out->tokens.size()) >= r.params.max_tokens ||
      static_cast<int64_t>(s.tokens.size()) >= r.context) {
    finish_seq(s, FinishReason::kLength);
    return false;
  }
  return true;
}

// Drafts stay inside the block that holds the sequence's next position, and never fill it:
// the step then completes no block, so no block is ever keyed for the prefix cache with a
// draft in it, quantized pages never pack one (a crop into a packed block would restore its
// tokens dequantized, not as computed), and crop(-rejected) only shortens the private last
// block — the step needs exactly the blocks a plain decode needs. The cost: near a block's end
// (its last two positions) a sequence decodes plainly.
void Engine::propose_drafts(Seq& s, int64_t spare) {
  s.drafts.clear();
  s.pad = 0;
  const Request& r = *s.req;
  if (r.spec_k <= 0 || !r.first_token) return;
  const int64_t left = r.params.max_tokens - static_cast<int64_t>(s.out->tokens.size());
  const int64_t k = std::min(
      {r.spec_k, spare, left - 1, draft_room(s.computed, r.context, store_->block_tokens())});
  if (k <= 0) return;
  s.drafts = ngram_propose(s.tokens, config_.spec_ngram, k);
}

void Engine::verify_contained(Seq& s, std::span<const float> logits) {
  if (s.state != SeqState::kRunning) return;  // a sibling's failure ended the request
  try {
    verify_drafts(s, logits);
  } catch (const std::exception& e) {
    fail_request(*s.req, RequestErrorKind::kEngine,
                 std::string("verifying speculative drafts failed: ") + describe(e));
    check_after_failure("a failed verification");
  }
}

// Row j's logits are the bits a one-token decode of the same history gives (batch-invariant
// linears, per-row attention): greedy samples each row with the sampler plain decoding calls,
// on the same history, so the tokens are plain decoding's; sampling accepts draft j by the
// rejection rule with q one-hot (speculative_accept), which makes every token follow the
// sampler's distribution p, and the row after the last accepted draft draws from p.
void Engine::verify_drafts(Seq& s, std::span<const float> logits) {
  Request& r = *s.req;
  const auto V = static_cast<size_t>(model_.config().vocab_size);
  const auto m = static_cast<int64_t>(s.drafts.size());
  const bool greedy = s.sampler->params().temperature <= 0.0f;
  s.computed += m + s.pad + 1;  // the store holds the last token, the drafts and the padding
  r.output.stats.spec_drafted += m;
  counters_.spec_drafted += m;
  int64_t accepted = 0;
  for (int64_t j = 0; j <= m; ++j) {
    const std::span<const float> row = logits.subspan(static_cast<size_t>(j) * V, V);
    int32_t tok = -1;
    if (greedy) {
      tok = s.sampler->sample(row, s.tokens);
    } else {
      s.sampler->probabilities(row, s.tokens, spec_p_);
      tok = j < m ? speculative_accept(spec_p_, {}, s.drafts[static_cast<size_t>(j)], s.spec_rng,
                                       spec_work_)
                        .token
                  : draw_from(spec_p_, s.spec_rng);
    }
    const bool agreed = j < m && tok == s.drafts[static_cast<size_t>(j)];
    if (agreed) {  // counted before emit_token, whose finish may deliver the request's output
      ++accepted;
      ++r.output.stats.spec_accepted;
      ++counters_.spec_accepted;
    }
    if (!emit_token(s, row, tok) || !agreed) break;
  }
  if (s.state != SeqState::kRunning) return;  // finished: its store sequence is gone
  const int64_t rejected = m + s.pad - accepted;
  if (rejected > 0) {
    const SeqId one[1] = {s.sid};
    store_->set_batch(one);
    store_->crop(-rejected);
    s.computed -= rejected;
  }
}

void Engine::emit_text(Seq& s, int32_t token, std::optional<TokenLogprob> logprob) {
  Request& r = *s.req;
  StreamEvent ev;
  ev.id = r.id;
  ev.index = s.index;
  ev.token = token;
  ev.logprob = std::move(logprob);
  if (tokenizer_ != nullptr) {
    fault::point("engine.detokenize");
    const size_t n = s.tokens.size();
    const std::string piece = tokenizer_->piece_after(n >= 2 ? s.tokens[n - 2] : -1, token);
    std::string& text = s.out->text;
    text += piece;
    size_t max_stop = 0;
    for (const std::string& st : r.params.stop_strings) max_stop = std::max(max_stop, st.size());
    // A new match ends past `sent` (earlier text was checked when it was streamed).
    const size_t from = s.sent >= max_stop ? s.sent - max_stop + 1 : 0;
    size_t cut = std::string::npos;
    for (const std::string& st : r.params.stop_strings) cut = std::min(cut, text.find(st, from));
    if (cut != std::string::npos) {
      text.resize(cut);
      finish_seq(s, FinishReason::kStop, std::move(ev.logprob));  // streams text[sent, cut)
      return;
    }
    // Hold back a suffix that may grow into a stop string, and incomplete UTF-8.
    size_t hold = 0;
    for (const std::string& st : r.params.stop_strings)
      for (size_t k = std::min(st.size() - 1, text.size()); k > hold; --k)
        if (text.compare(text.size() - k, k, st, 0, k) == 0) {
          hold = k;
          break;
        }
    hold = std::max(hold, incomplete_utf8_tail(text));
    const size_t safe = std::max(s.sent, text.size() - hold);
    ev.text = text.substr(s.sent, safe - s.sent);
    s.sent = safe;
  }
  deliver(s, ev);
}

void Engine::deliver(Seq& s, StreamEvent& ev) {
  if (!s.reported) ev.prompt_logprobs = s.req->prompt_scores;
  s.reported = true;
  invoke_callback(*s.req, ev);
}

void Engine::finish_seq(Seq& s, FinishReason reason, std::optional<TokenLogprob> logprob) {
  Request& r = *s.req;
  if (s.sid >= 0) {
    store_->free_sequence(s.sid);  // frees at once; full blocks stay cached
    s.sid = -1;
  }
  if (s.state == SeqState::kRunning)
    running_.erase(std::find(running_.begin(), running_.end(), &s));
  if (s.state == SeqState::kWaiting) {
    auto it = std::find(waiting_.begin(), waiting_.end(), &s);
    if (it != waiting_.end()) waiting_.erase(it);
    auto rt = std::find(remote_wait_.begin(), remote_wait_.end(), &s);
    if (rt != remote_wait_.end()) remote_wait_.erase(rt);
  }
  s.state = SeqState::kFinished;
  s.out->reason = reason;
  StreamEvent ev;
  ev.id = r.id;
  ev.index = s.index;
  ev.finished = true;
  ev.reason = reason;
  ev.logprob = std::move(logprob);
  if (s.sent < s.out->text.size()) ev.text = s.out->text.substr(s.sent);
  s.sent = s.out->text.size();
  deliver(s, ev);
  finish_request_if_done(r);
}

void Engine::finish_request_if_done(Request& r) {
  if (r.done) return;
  for (auto& s : r.seqs)
    if (s->state != SeqState::kFinished) return;
  r.done = true;
  r.output.stats.total_seconds = seconds_since(r.t_submit);
  bool cancelled = false;
  for (auto& s : r.seqs) cancelled |= s->out->reason == FinishReason::kCancelled;
  if (cancelled) ++counters_.requests_cancelled;
  ++counters_.requests_finished;
  {  // what the cache holds of it, for a later slot save (finished_tokens)
    std::vector<int32_t> tokens = r.params.prompt;
    if (!r.seqs.empty() && r.seqs[0]->out)
      tokens.insert(tokens.end(), r.seqs[0]->out->tokens.begin(), r.seqs[0]->out->tokens.end());
    std::lock_guard<std::mutex> lock(mu_);
    finished_.push_back(
        Finished{r.id, std::move(tokens), !r.params.cache_salt.empty(), r.policy.key()});
    ++requests_by_policy_[r.policy.key()];
    if (finished_.size() > kFinishedKept) finished_.pop_front();
  }
  leave_queue(r);
  // Publish the metrics before the last callback: a client that sees its request end and then
  // reads /metrics must see its blocks returned, not the snapshot of the previous step.
  update_metrics();
  fault::point("engine.request_output");  // tests: delay the last event after the finish events
  StreamEvent ev;
  ev.id = r.id;
  ev.finished = true;
  ev.output = &r.output;
  invoke_callback(r, ev);
}

bool Engine::step() {
  const Clock::time_point t0 = Clock::now();
  drain_inbox();
  bool work = !running_.empty() || !waiting_.empty();
  if (!work && !remote_wait_.empty()) {
    // Only remote lookups in flight: sleep until one answers, a wait expires, or a request,
    // cancel or task arrives (the tier's callback notifies cv_).
    Clock::time_point until = Clock::time_point::max();
    for (const Seq* s : remote_wait_) until = std::min(until, s->req->remote_deadline);
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_until(lock, until, [&] {
        return remote_ready_ || !inbox_.empty() || !cancels_.empty() || !tasks_.empty();
      });
    }
    drain_inbox();
    work = !running_.empty() || !waiting_.empty();
  }
  if (work) {
    ++step_id_;
    step_ran_ = false;
    int64_t budget = config_.max_tokens_per_step;
    if (config_.scheduler == SchedulerPolicy::kFifo) {
      run_decodes(budget);
      continue_prefills(budget);
      admit_waiting(budget);
    } else {
      continue_prefills(budget);
      admit_waiting(budget);
      run_decodes(budget);
    }
    ++counters_.steps;
    if (config_.check_invariants_every_step)
      if (const std::string inv = check_invariants(); !inv.empty())
        fatal("after step " + std::to_string(counters_.steps) + ": " + inv);
  }
  // Finished requests leave (their callbacks have run).
  requests_.erase(
      std::remove_if(requests_.begin(), requests_.end(), [](const auto& r) { return r->done; }),
      requests_.end());
  if (work) counters_.busy_seconds += seconds_since(t0);
  update_metrics();
  return work;
}

void Engine::run_until_idle() {
  while (has_work()) step();
}

void Engine::update_metrics() {
  const BlockPoolStats ps = store_->stats(full_group_).pool;
  std::lock_guard<std::mutex> lock(mu_);
  metrics_ = counters_;
  metrics_.running = static_cast<int64_t>(running_.size());
  counters_.running_peak = std::max(counters_.running_peak, metrics_.running);
  metrics_.running_peak = counters_.running_peak;
  metrics_.waiting = static_cast<int64_t>(waiting_.size() + remote_wait_.size()) +
                     static_cast<int64_t>(inbox_.size());
  metrics_.blocks_total = ps.total;
  metrics_.blocks_free = ps.free;
  metrics_.blocks_used = ps.used;
  metrics_.blocks_cached = ps.cached;
  metrics_.linear_state_bytes = static_cast<int64_t>(store_->linear_state_bytes());
  metrics_.snapshot_bytes = static_cast<int64_t>(store_->snapshot_bytes());
  metrics_.compressed_model = store_->has_compressed();
  metrics_.prefix_refused_compressed = store_->prefix_refused_compressed();
  if (const DiskTier* disk = store_->disk_tier()) {
    metrics_.disk_tier = true;
    metrics_.disk_budget_bytes = disk->options().budget_bytes;
    metrics_.disk = disk->stats();
    metrics_.disk_loads_failed = store_->disk_loads_failed();
  }
  if (const RemoteTier* remote = store_->remote_tier()) {
    metrics_.remote_tier = true;
    metrics_.remote_url = config_.kv_remote_url;
    metrics_.remote = remote->stats();
    metrics_.remote_loads_failed = store_->remote_loads_failed();
  }
  if (const LinearSnapshotStore* snaps = store_->snapshots()) {
    metrics_.snapshots = snaps->size();
    metrics_.snapshots_dropped = snaps->stats().dropped_with_block;
  }
}

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  {
    std::lock_guard<std::mutex> lock(mu_);
    m = metrics_;
  }
  // The tiers write behind on their own threads, also while the engine idles (no step publishes
  // a snapshot then): their counters are read now, under the tiers' own locks. The pointers are
  // set once, before any other thread runs.
  if (const DiskTier* disk = store_->disk_tier()) m.disk = disk->stats();
  if (const RemoteTier* remote = store_->remote_tier()) m.remote = remote->stats();
  return m;
}

std::string Engine::check_invariants() const {
  std::string err = store_->check_invariants();
  if (!err.empty()) return err;
  for (const Seq* s : running_) {
    if (s->sid < 0 || !store_->is_live(s->sid))
      return "running sequence without a live store sequence";
    if (store_->length(s->sid) != s->computed)
      return "sequence length " + std::to_string(store_->length(s->sid)) + " != computed " +
             std::to_string(s->computed);
  }
  for (const Seq* s : waiting_)
    if (s->sid >= 0) return "waiting sequence still holds a store sequence";
  for (const Seq* s : remote_wait_)
    if (s->sid >= 0) return "a sequence waiting for the remote tier holds a store sequence";
  if (running_.empty()) {
    for (int g = 0; g < store_->num_groups(); ++g) {
      const int32_t used = store_->stats(g).pool.used;
      const int32_t null_blocks = store_->has_null_block(g) ? 1 : 0;
      if (used != null_blocks)
        return "group " + std::to_string(g) + ": " + std::to_string(used) +
               " blocks used with no sequence resident";
    }
  }
  return {};
}

}  // namespace kvcache
