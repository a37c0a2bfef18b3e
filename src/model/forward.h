// Forward: one chunk of tokens through a Model, with the KV cache behind its one call per
// attention layer. The loop knows no family:
//
//   embed (x embed_scale) -> the model's Stack runs the Blocks (per layer: attention, MLP, and
//   whatever the family's stack adds around them) -> final norm -> LM head -> [final softcap]
//
// A Forward owns the activation workspace of one batch of sequences (sized up front for a
// number of rows = batch x chunk tokens, grown only when a larger chunk arrives), the attention
// kernel chosen by name, and a "recompute" cache for calls without one; it is not thread-safe.
// The Cache of a call is the caller's and only borrowed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "cache/cache.h"
#include "kernels/attention_kernel.h"
#include "model/model.h"
#include "model/workspace.h"

namespace kvcache {

enum class LogitsMode {
  kLast,  // next-token logits of the last position of each batch row: [B, vocab]
  kAll,   // every position: [B, S, vocab] (llama.cpp's logits_all)
  kNone,  // fill the cache only
};

struct ForwardParams {
  const int32_t* tokens = nullptr;  // [batch, n_tokens], row-major
  int64_t batch = 1;
  int64_t n_tokens = 0;  // S: a prefill chunk, or 1 for decode
  int64_t pos0 = 0;      // absolute position of tokens[:, 0]
  // [batch] absolute position of tokens[b, 0] when rows are at different positions (a varlen
  // batch through a paged cache); nullptr: every row starts at pos0.
  const int64_t* row_pos0 = nullptr;
  // The KV store. nullptr: the forward's own "recompute" container (cache/recompute_layer.h),
  // which keeps only this call's K/V — the chunk attends to its own keys, from position 0: the
  // full-recompute reference that --verify compares against.
  Cache* cache = nullptr;
  LogitsMode logits = LogitsMode::kLast;
  // Linears use only the row-wise kernels (no BLAS): each row's result is then independent of
  // how many rows the call carries, so a batched or re-chunked sequence is bit-identical to the
  // sequence run alone (the serving engine's guarantee). Slower prefill.
  bool batch_invariant = false;
};

// The config of a cache for `model`: its layer types, sliding window, chunk size, KV-shared
// tail and what its attention stores (per-head K/V or MLA's latent), with the user's `options`.
// The caches Forward runs on are built from it.
CacheConfig model_cache_config(const ModelConfig& model, CacheOptions options);

class Forward {
 public:
  // kernel: an attention kernel name ("eager", "fused", ...; Error listing them otherwise).
  Forward(const Model& model, std::string_view kernel, int64_t max_rows = 1);

  // Runs one chunk; returns the logits (see LogitsMode), valid until the next call.
  // Throws Error(kInvalidArgument) for token ids outside the vocabulary or a cache built for
  // another layer plan — before anything is written — and whatever the cache or the kernel
  // throws (a static cache's capacity, a span the kernel cannot read).
  std::span<const float> forward(const ForwardParams& p);

  const Model& model() const { return model_; }
  size_t workspace_bytes() const { return ws_.bytes(); }
  // What workspace_bytes() is after reserving `rows` rows for `config` (the memory planner's
  // activation peak; buffers that follow the visible history, MLA's, are not counted).
  static size_t workspace_bytes_for(const ModelConfig& config, int64_t rows);

 private:
  // The call's geometry and options, after checking the arguments and the cache.
  Step begin(const ForwardParams& p, Cache& cache);
  // x [R, dim] <- the embedding rows of the tokens (any weight dtype), x embed_scale.
  void embed(const Step& st, const int32_t* tokens);
  // Final norm and LM head on the rows the logits mode wants; `kept` rows of x hold the stream.
  std::span<const float> head(const Step& st, int64_t kept, LogitsMode mode);

  const Model& model_;
  AttentionKernel kernel_;
  Workspace ws_;
  std::unique_ptr<Cache> recompute_;
};

}  // namespace kvcache
