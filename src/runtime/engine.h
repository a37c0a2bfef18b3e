// Engine: continuous batching over the paged KV cache. Requests flow waiting -> running ->
// finished; each step() fills a token budget (EngineConfig::scheduler: decodes first, then
// chunked prefill; or prefill first), runs the decode rows as one batched forward and each
// prefill chunk as its own forward, samples, and reports tokens through per-request callbacks.
// The engine owns the PagedKVStore, the Cache over it and the forward; one thread drives step(),
// any thread may submit() or cancel().
//
// Memory: blocks come from the paged planner (or EngineConfig::num_blocks). submit refuses a
// request that some layer group could not hold even alone (check_group_capacity). A new request
// is admitted only when its uncached tail fits (attach_prefix counts the cached prefix for free)
// and, under a FIFO safety margin, while the pool keeps that margin free; when a running step
// runs out of blocks, the newest running sequence is preempted — its blocks freed (full ones
// stay in the prefix index), its tokens kept, recomputed on readmission (vLLM's recompute
// preemption).
//
// Failures: an exception inside a forward (a kernel refusing its span, an allocation) fails the
// requests of that forward with its message, undoes the store's open step (PagedKVStore::
// abort_step) and the engine goes on serving the others; one inside a request's sampling or
// detokenizing fails that request only. Afterwards check_invariants() must hold, else the
// process ends (a bug: it must not serve from a corrupt cache). Exceptions that escape step()
// are bugs too; callers end the process rather than step again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/paged_store.h"
#include "cache/remote_tier.h"
#include "core/kv_client.h"
#include "model/forward.h"
#include "model/paged_plan.h"
#include "model/tokenizer.h"
#include "runtime/sampler.h"

namespace kvcache {

// The order one step fills its token budget in (transformers v5's continuous-batching
// schedulers, generation/continuous_batching/scheduler.py: FIFOScheduler and
// PrefillFirstScheduler).
// - kFifo: decodes of every running sequence first, then running sequences still prefilling
//   (chunked prompts, recomputation after preemption), then waiting requests (today's order;
//   the serving default: a new request never slows the streams already running).
// - kPrefillFirst: running sequences still prefilling, then waiting requests, then decodes:
//   new requests reach their first token sooner while the running streams pause. v5 puts its
//   waiting requests after the decodes (a FIXME there asks for this order); a sequence whose
//   prefill ended in a step samples its first token there and decodes from the next step on.
enum class SchedulerPolicy { kFifo, kPrefillFirst };
const char* scheduler_policy_name(SchedulerPolicy p);  // "fifo", "prefill-first"
// "fifo" or "prefill-first" (also "prefill_first"); Error(kInvalidArgument) naming both.
SchedulerPolicy parse_scheduler_policy(const std::string& name);

struct EngineConfig {
  std::string kernel = "fused";  // attention kernel for paged spans (eager, fused)
  // The paged cache every request shares. The engine reads paged.block_tokens, kv_dtype
  // (unset: f32) and max_cache_len: without a budget, the tokens the pool holds (0: 16384).
  // It builds the store itself and batches max_running sequences: implementation stays
  // "paged", paged.store unset and max_batch_size 0 (Error otherwise). cache.policy is the
  // requests' default eviction policy: exact, or streaming (the store then reserves a null
  // block per full group so that any request may stream; see PagedKVStore).
  CacheOptions cache{.implementation = "paged"};
  uint64_t kv_budget_bytes = 0;       // > 0: the planner splits it (blocks + activations)
  int32_t num_blocks = 0;             // > 0: override the block count (tests forcing preemption)
  int64_t max_tokens_per_step = 256;  // token budget of one step (decodes + prefill chunks)
  int32_t max_running = 64;           // sequences resident at once
  SchedulerPolicy scheduler = SchedulerPolicy::kFifo;
  // FIFO's admission rule (v5's FIFOScheduler safety_margin): while some group's allocatable
  // blocks (free + cached) are fewer than safety_margin x its blocks, no waiting request is
  // admitted in a step that already ran something (a step that ran nothing admits one, so the
  // engine always progresses); decodes and running prefills go on. In [0, 1). Default 0, not
  // v5's 0.2: without it a full pool is met by preempting the newest sequence (recompute), which
  // v5 does not have, and 0 keeps the engine's behaviour and every capacity figure unchanged;
  // a margin trades admitted requests for fewer preemptions under memory pressure.
  // kPrefillFirst has no margin (as in v5): > 0 there is an Error.
  double safety_margin = 0;
  int64_t max_waiting = 1024;  // submit() refuses beyond this many queued requests
  // Linears never use BLAS, so every row's result is independent of the batch and of the
  // chunking: batched, preempted and prefix-cached runs are bit-identical to a request run
  // alone. Costs prefill speed (row-wise GEMV instead of sgemm); decode batches are unaffected
  // (one read of W serves every row either way).
  bool batch_invariant = true;
  // Debug: check_invariants() after every step, ending the process when it fails (load tests).
  bool check_invariants_every_step = false;
  // The disk tier under the prefix cache (cache/disk_tier.h; serve --kv-disk DIR
  // --kv-disk-budget B): empty dir, none. Its fingerprint folds the model's fingerprint with the
  // store's page layout, so another model, dtype or layout never finds these files. Refused
  // (Error kUnsupported) for models with linear, compressed or indexed layers.
  std::string kv_disk_dir;
  uint64_t kv_disk_budget_bytes = 10ull << 30;
  // The shared remote tier (cache/remote_tier.h; serve --kv-remote URL): on when
  // kv_remote_client is set (the CLI makes Redis clients for kv_remote_url; tests pass an
  // in-memory one). A new request whose prompt goes past the local (RAM + disk) hit waits,
  // not admissible, for a lookup of the rest, at most about twice the deadline; its verified
  // blocks are loaded at admission. Refused (Error kUnsupported) like the disk tier.
  std::string kv_remote_url;  // for reports
  std::function<std::unique_ptr<KvClient>()> kv_remote_client;
  int32_t kv_remote_deadline_ms = 50;
  uint64_t kv_remote_write_budget_bytes = 64ull << 20;
  // Prompt-lookup speculative decoding (serve / batch --spec ngram --spec-k K --spec-ngram N;
  // runtime/speculative.h): a decoding sequence runs its last token and up to spec_k drafts
  // (the tokens that followed the latest earlier occurrence of its last <= spec_ngram tokens)
  // in one forward, keeps the drafts its own samples agree with plus one token, and crops the
  // rest. 0: off. Needs exact KV (no streaming) and only full-attention layers; the drafts
  // stay inside the sequence's last block (see Engine::propose_drafts), so block_tokens >= 3.
  int64_t spec_k = 0;
  int64_t spec_ngram = 3;
};

// The planner options the engine sizes its store with (runtime/engine.cc): also what serve's
// memory-based pool sizing plans with, so both bill the same bytes (quantized pages included).
// max_cached_tokens: cache.max_cache_len, or the engine's default pool.
PagedPlanOptions engine_plan_options(const Model& model, const EngineConfig& config);

// The disk tier for `store` under `dir` (cache/disk_tier.h), its fingerprint folding the
// model's fingerprint with the store's page layout; not yet attached (set_disk_tier).
std::shared_ptr<DiskTier> open_disk_tier(const Model& model, const PagedKVStore& store,
                                         const std::string& dir, uint64_t budget_bytes);

// The remote tier for `store` (cache/remote_tier.h): its fingerprint folds the model's and the
// tokenizer's fingerprints (model/fingerprint.h; nullptr tokenizer: "none"), the KV dtype,
// block_tokens and the store's page layout. Not yet attached (set_remote_tier).
std::shared_ptr<RemoteTier> open_remote_tier(const Model& model, const Tokenizer* tokenizer,
                                             const PagedKVStore& store, const EngineConfig& config);

enum class FinishReason { kNone, kLength, kStop, kCancelled, kError };
const char* finish_reason_name(FinishReason r);  // "length", "stop", "cancelled", "error"

// A token as log-probabilities name it: its piece, or "token_id:N" without a tokenizer.
std::string logprob_piece(const Tokenizer* tokenizer, int32_t token);

struct RequestParams {
  std::vector<int32_t> prompt;    // token ids (BOS included by the caller)
  int64_t max_tokens = 16;        // new tokens per sample (0: the prompt only, nothing sampled)
  SamplerParams sampler;          // sample i uses seed + i
  std::vector<int32_t> stop_ids;  // sampled -> stop (not emitted)
  std::vector<std::string> stop_strings;  // needs a tokenizer; text is cut before the match
  int32_t n = 1;                          // parallel samples (forked after the prompt)
  // -1: none; k in [0, kMaxTopLogprobs]: each generated token's log-probability and the k most
  // likely tokens at its step (see TokenLogprob).
  int32_t logprobs = -1;
  // -1: none; k in [0, kMaxTopLogprobs]: the log-probability of every prompt token after the
  // first (given the tokens before it) and the k most likely tokens there, in
  // RequestOutput::prompt_logprobs (OpenAI's echo with logprobs, as evaluation harnesses score
  // a text). The prompt is then computed whole, not taken from the prefix cache, since cached
  // positions have no logits.
  int32_t prompt_logprobs = -1;
  // A tenant's salt (the servers' `cache_salt` field, as vLLM's): folded into every block key of
  // the request's sequences, so a prefix is shared only between requests with the same salt, in
  // RAM and in the disk tier (empty: unsalted requests share among themselves).
  std::string cache_salt;
  // The eviction policy of this request's KV (the servers' `kv_policy` field); unset: the
  // engine's (EngineConfig::cache.policy). Only exact and StreamingLLM run on the paged store,
  // and streaming only on an engine started with a streaming policy (its pool reserves the
  // null blocks); anything else is refused at submit. Folded into every block key.
  std::optional<KVPolicy> kv_policy;
  // Speculative decoding for this request (the servers' `speculative: {"k": K}`): -1, the
  // engine's EngineConfig::spec_k; 0, off; 1 .. spec_k, at most that many drafts per step.
  // More than the engine's, or any k > 0 on an engine without it, is refused at submit.
  int64_t spec_k = -1;
};

// Per-request statistics, final when the request finishes.
struct RequestStats {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;         // prompt tokens taken from the prefix cache at first admission
  int64_t cached_tokens_disk = 0;    // of which loaded from the disk tier
  int64_t cached_tokens_remote = 0;  // of which loaded from the remote tier (the rest: RAM)
  int64_t completion_tokens = 0;     // over all samples, stop tokens excluded
  int64_t preemptions = 0;
  double queue_seconds = 0;  // submit -> first admission
  double ttft_seconds = 0;   // submit -> first token
  double total_seconds = 0;  // submit -> finished
  // What kept this request's KV (Engine::kv_pages_label / kv_policy_label): its pages' format
  // ("f16", "kivi-4", "q8_0") and the eviction policy ("exact": nothing evicted).
  std::string kv_pages;
  std::string kv_policy;
  // Speculative decoding (RequestParams::spec_k): draft tokens verified, and of them accepted,
  // over all samples. Both 0 when it was off.
  bool speculative = false;  // it ran with speculative decoding (resolved spec_k > 0)
  int64_t spec_drafted = 0;
  int64_t spec_accepted = 0;
};

// One sample's outcome.
struct SampleOutput {
  std::vector<int32_t> tokens;  // generated ids, stop id excluded
  std::string text;             // with a tokenizer: decoded, cut before a stop string
  FinishReason reason = FinishReason::kNone;
  std::vector<TokenLogprob> logprobs;  // one per token when RequestParams::logprobs >= 0
};

// Why a request ended with FinishReason::kError.
enum class RequestErrorKind {
  kNone,
  kCapacity,  // it cannot fit the KV cache even alone (a client error: retrying cannot help)
  kEngine,    // a forward, the sampler or the detokenizer failed while serving it
};

struct RequestOutput {
  uint64_t id = 0;
  std::vector<SampleOutput> samples;  // [n]
  // With RequestParams::prompt_logprobs >= 0: [prompt size - 1], entry i for prompt token i + 1.
  std::vector<TokenLogprob> prompt_logprobs;
  RequestStats stats;
  std::string error;  // reason kError: why
  RequestErrorKind error_kind = RequestErrorKind::kNone;
};

// A streaming event, delivered on the engine thread. Per sample: zero or more token events
// (token >= 0, text = the new text, possibly empty while a stop string may still match), then
// one event with finished = true. After every sample finished, one event with `output` set.
struct StreamEvent {
  uint64_t id = 0;
  int32_t index = 0;  // sample
  int32_t token = -1;
  std::string text;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  const RequestOutput* output = nullptr;  // request done (valid during the callback)
  // When the request asked for them: the token's log-probabilities, on its token event, or on
  // the finish event when a stop string ended the sample at that token.
  std::optional<TokenLogprob> logprob;
  // With RequestParams::prompt_logprobs: the prompt's scores (RequestOutput::prompt_logprobs),
  // on each sample's first event once the prompt was scored whole, so that a stream can echo
  // them before the sample's tokens.
  std::shared_ptr<const std::vector<TokenLogprob>> prompt_logprobs;
};
using StreamCallback = std::function<void(const StreamEvent&)>;

struct EngineMetrics {
  int64_t running = 0, waiting = 0;
  int64_t running_peak = 0;  // the most sequences resident at once so far
  int64_t blocks_total = 0, blocks_free = 0, blocks_used = 0, blocks_cached = 0;
  int64_t prompt_tokens = 0;                // all prompts admitted (first admissions)
  int64_t cached_prompt_tokens = 0;         // of which from the prefix cache
  int64_t cached_prompt_tokens_disk = 0;    // of those, loaded from the disk tier
  int64_t cached_prompt_tokens_remote = 0;  // of those, loaded from the remote tier
  int64_t computed_prompt_tokens = 0;       // prefill tokens actually run (recomputation included)
  int64_t generation_tokens = 0;
  int64_t preemptions = 0;
  int64_t requests_finished = 0, requests_cancelled = 0;
  int64_t steps = 0;
  int64_t requests_failed = 0;              // ended with an error (capacity or engine)
  int64_t failed_forwards = 0;              // forwards that threw (their requests failed)
  int64_t consecutive_failed_forwards = 0;  // since the last forward that succeeded
  std::string last_error;                   // the latest failed forward's message
  // Speculative decoding: draft tokens verified and accepted (acceptance rate: their ratio).
  int64_t spec_drafted = 0, spec_accepted = 0;
  int64_t forwards = 0;     // model forwards: per step one for the decodes, one per
                            // prefill chunk or batch of equal-length chunks
  double busy_seconds = 0;  // time spent inside step()
  // Hybrid models (0 otherwise): the linear-attention state slots (+ workspaces) and the
  // snapshot arena, both constant; snapshots held now, and dropped with their blocks so far.
  int64_t linear_state_bytes = 0, snapshot_bytes = 0;
  int64_t snapshots = 0, snapshots_dropped = 0;
  // Models with compressed (CSA/HCA) layers: prefix hits refused because the compressors' state
  // at the hit is not kept (the prompt is recomputed; /metrics
  // kvcache_prefix_refused_total{reason="compressed_state"}).
  bool compressed_model = false;
  int64_t prefix_refused_compressed = 0;
  // The disk tier (EngineConfig::kv_disk_dir; disk_tier false: none): its counters and
  // budget, and the store's loads that failed (no block free, or a file refused).
  bool disk_tier = false;
  uint64_t disk_budget_bytes = 0;
  DiskTierStats disk;
  int64_t disk_loads_failed = 0;
  // The remote tier (EngineConfig::kv_remote_client; remote_tier false: none): its counters,
  // the store's loads that failed (no block free), and lookups the engine stopped waiting for.
  bool remote_tier = false;
  std::string remote_url;
  RemoteTierStats remote;
  int64_t remote_loads_failed = 0;
  int64_t remote_waits_expired = 0;
  double prefix_hit_rate() const {
    return prompt_tokens > 0
               ? static_cast<double>(cached_prompt_tokens) / static_cast<double>(prompt_tokens)
               : 0.0;
  }
};

class Engine {
 public:
  // tokenizer may be nullptr (then stop strings are refused and text stays empty).
  Engine(const Model& model, const Tokenizer* tokenizer, const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates (Error kInvalidArgument: empty prompt, ids out of range, prompt +
  // max_tokens beyond the cache, n < 1, stop strings without tokenizer) and queues. Returns
  // the request id, or 0 when the queue is full (max_waiting).
  uint64_t submit(RequestParams params, StreamCallback callback);
  // Thread-safe: the request finishes with kCancelled at the next step; its blocks are freed.
  void cancel(uint64_t id);

  // One scheduling step on the calling thread. Returns false when there was nothing to do.
  bool step();
  // Steps until no request is waiting or running.
  void run_until_idle();
  bool has_work() const;
  // Blocks until work arrives or `seconds` pass (the server's driver loop).
  void wait_for_work(double seconds);
  void notify();  // wakes wait_for_work (shutdown)

  EngineMetrics metrics() const;  // thread-safe snapshot
  // Empty when consistent: the store's invariants, and the used blocks are exactly those of
  // the resident sequences. Call on the engine thread (or when idle).
  std::string check_invariants() const;
  const EngineConfig& config() const { return config_; }
  int64_t max_context() const { return max_context_; }  // prompt + max_tokens limit
  // The pool's page format ("f32", "f16", "bf16", "kivi-2/4/8", "q8_0", "q4_0") and eviction
  // policy ("exact"): /metrics and every response's usage say which served.
  const std::string& kv_pages_label() const { return kv_pages_; }
  const std::string& kv_policy_label() const { return kv_policy_; }
  PagedKVStore& store() { return *store_; }
  const Model& model() const { return model_; }

  // Thread-safe: runs `task` on the engine thread at the start of the next step, between
  // forwards (no store step open): work on the store from other threads (the server's slot
  // save / restore). The task must not throw (it reports through its own channel).
  void post(std::function<void()> task);
  // Thread-safe: the tokens request `id` left in the cache (its prompt and its first sample's
  // generated tokens), for the last kFinishedKept finished requests; empty when unknown.
  static constexpr size_t kFinishedKept = 64;
  // The longest RequestParams::cache_salt submit() accepts (it is hashed into every block key).
  static constexpr size_t kMaxCacheSalt = 1024;
  // *salted (when given): whether the request had a cache_salt.
  // *policy (when given): the key of the policy it ran under ("exact", "streaming:...").
  std::vector<int32_t> finished_tokens(uint64_t id, bool* salted = nullptr,
                                       std::string* policy = nullptr) const;
  // Requests finished per policy key, over the engine's life (/metrics).
  std::map<std::string, int64_t> requests_by_kv_policy() const;

 private:
  struct Request;
  struct Seq;

  // The request's cache_salt as the block keys' extra bytes (empty: none).
  static std::span<const uint8_t> salt_of(const Request& r);
  void drain_inbox();
  // A new request's lookup in the remote tier, when its prompt goes past the local hit: true
  // when one was started (the request then waits in remote_wait_).
  bool start_remote_lookup(Request& r);
  // Moves the requests whose lookups answered, or whose wait expired, to waiting_.
  void poll_remote();
  void continue_prefills(int64_t& budget);  // running sequences still prefilling, oldest first
  void admit_waiting(int64_t& budget);      // waiting sequences, while budget and blocks last
  // FIFO's safety margin: some group's allocatable blocks are below the margin.
  bool outside_safety_margin() const;
  // Error(kInvalidArgument) naming the group when a request of `tokens` tokens (prompt +
  // max_tokens) under `policy` needs more blocks of some group at once than the group has:
  // full groups its tokens' blocks, sliding groups at most the window plus one step's chunk,
  // compressed groups their entries' blocks.
  void check_group_capacity(int64_t tokens, const KVPolicy& policy) const;
  // Error naming what stops speculative decoding (EngineConfig::spec_k) on this engine.
  void check_spec_config() const;
  void admit_batched(int64_t& budget);
  void note_admitted(Seq& s, int64_t matched);
  void leave_queue(Request& r);  // once per request: admitted, or finished while queued
  void run_decodes(int64_t& budget);
  // One forward of `group`'s decodes, n rows each (the last token and n - 1 drafts); preempts
  // the newest running sequence while the blocks do not suffice.
  void run_decode_group(std::vector<Seq*>& group, int64_t n, int64_t& budget);
  enum class ChunkStatus { kOk, kOutOfBlocks, kFailed };
  ChunkStatus run_chunk(Seq& s, int64_t n);                  // plan_chunk, then forward_chunk
  int64_t hybrid_chunk(const Seq& s, int64_t budget) const;  // the next prefill chunk's tokens
  bool plan_chunk(Seq& s, int64_t n);     // false: out of blocks, nothing changed
  bool forward_chunk(Seq& s, int64_t n);  // the planned chunk; false: it failed (contained)
  // Runs a planned forward of `seqs`; on an exception fails their requests, undoes the store's
  // step and returns false.
  bool forward_contained(const ForwardParams& p, std::span<Seq* const> seqs,
                         std::span<const float>& logits);
  // after_logits, failing the sequence's request when it throws.
  void sample_contained(Seq& s, std::span<const float> logits);
  void after_logits(Seq& s, std::span<const float> logits);
  // Records the sampled token `tok` of s (stop ids, logprobs, text, length): false when s
  // finished (its store sequence is then freed).
  bool emit_token(Seq& s, std::span<const float> logits, int32_t tok);
  // Speculative decoding: s.drafts for this step within `spare` budget tokens (may be none).
  void propose_drafts(Seq& s, int64_t spare);
  // After a forward of s's last token, its drafts and its padding (Seq::pad; logits [rows,
  // vocab]): samples row by row while the drafts are accepted, then crops the rejected drafts
  // and the padding from the store. Fails the request when it throws, as sample_contained.
  void verify_contained(Seq& s, std::span<const float> logits);
  void verify_drafts(Seq& s, std::span<const float> logits);
  // Ends every unfinished sample of `r` with kError (no-op when r is done).
  void fail_request(Request& r, RequestErrorKind kind, const std::string& message);
  // After a contained failure: the engine must still be consistent, else the process ends.
  void check_after_failure(const std::string& what);
  void invoke_callback(Request& r, const StreamEvent& ev);
  // log_softmax(logits)[token] and the top k, their pieces named by the tokenizer.
  TokenLogprob named_logprob(std::span<const float> logits, int32_t token, int32_t k) const;
  void preempt(Seq& s);
  Seq* newest_running();
  // logprob: the last token's, when a stop string ended the sample at it (its event is this one).
  void finish_seq(Seq& s, FinishReason reason, std::optional<TokenLogprob> logprob = std::nullopt);
  void finish_request_if_done(Request& r);
  void emit_text(Seq& s, int32_t token, std::optional<TokenLogprob> logprob);
  void deliver(Seq& s,
               StreamEvent& ev);  // to the callback; the sample's first carries the prompt scores
  void fork_samples(Seq& parent);
  void update_metrics();

  const Model& model_;
  const Tokenizer* tokenizer_;
  EngineConfig config_;
  std::shared_ptr<PagedKVStore> store_;
  std::unique_ptr<Cache> cache_;
  std::unique_ptr<Forward> forward_;
  int64_t max_context_ = 0;
  std::string kv_pages_, kv_policy_ = "exact";
  int32_t full_group_ = 0;  // the group whose pool the metrics report

  // Engine-thread state.
  std::vector<std::unique_ptr<Request>> requests_;
  std::deque<Seq*> waiting_;   // front first
  std::vector<Seq*> running_;  // admission order (newest last)
  uint64_t admit_counter_ = 0;
  uint64_t step_id_ = 0;   // the step running now (Seq::stepped)
  bool step_ran_ = false;  // this step ran a forward (the safety margin then holds admissions)
  std::vector<Seq*> remote_wait_;  // first samples waiting for their remote lookups
  // Step scratch (reused, no allocation once grown).
  std::vector<SeqId> batch_;
  std::vector<int32_t> step_tokens_;
  std::vector<int64_t> row_pos_;
  std::vector<Seq*> step_seqs_;
  std::vector<Seq*> spec_group_;           // the decodes of one row count (speculative steps)
  std::vector<float> spec_p_, spec_work_;  // speculative sampling: p and the residual

  // Shared with submitters.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> cancels_;
  std::vector<std::function<void()>> tasks_;  // post()
  struct Finished {
    uint64_t id = 0;
    std::vector<int32_t> tokens;
    bool salted = false;
    std::string policy;
  };
  std::deque<Finished> finished_;                      // finished_tokens()
  std::map<std::string, int64_t> requests_by_policy_;  // under mu_
  bool remote_ready_ = false;  // a remote lookup answered since the last poll
  uint64_t next_id_ = 1;
  int64_t queued_ = 0;     // inbox + waiting requests (bounded by max_waiting)
  EngineMetrics metrics_;  // snapshot published by update_metrics()
  // Engine-thread counters (copied into metrics_ under mu_ after each step).
  EngineMetrics counters_;
};

}  // namespace kvcache
