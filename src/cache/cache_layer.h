// The per-layer cache protocol: the one call model code makes per attention layer.
//
//   KVSpan kv = layer.update(k_new, v_new);   // after RoPE, before the attention kernel
//
// Everything else (what is stored, how, for how long) lives behind it, so swapping the
// container never touches model code. Mirrors transformers v5's CacheLayerMixin
// (cache_utils.py:27-110 in 5.16.1, per the KV cache notes) with C++ ownership rules:
// the span returned by update() is a set of non-owning views into the layer's storage (or a
// workspace it owns), valid until the next mutating call on the same layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/kv_span.h"
#include "core/tensor.h"

namespace kvcache {

class StateWriter;  // cache/layer_state.h
class StateReader;
struct AttentionOptions;  // kernels/attention.h

// What the attention mask must cover for the next update of `query_len` tokens: the span
// update() will return has kv_length keys, the first at absolute position kv_offset.
// Call it BEFORE update(), as transformers' get_mask_sizes is called while building masks.
struct MaskSizes {
  int64_t kv_length = 0;
  int64_t kv_offset = 0;
};

// Bytes a container moved on its own (reallocation, compaction, row gathers, workspace
// fills) as opposed to the unavoidable write of the new tokens. Tests bound these; the CLI
// shows them. Containers that never move data report zeros.
struct CopyStats {
  size_t bytes_copied = 0;     // K+V bytes moved
  int64_t reallocations = 0;   // storage replaced by a larger one
  int64_t compactions = 0;     // live window moved to the front of the storage
  int64_t workspace_uses = 0;  // updates whose returned span was assembled in a workspace
};

class CacheLayer {
 public:
  virtual ~CacheLayer() = default;

  // Appends k, v ([B, H_kv, S_new, D], any float dtype; converted to the storage dtype) and
  // returns every key/value the new queries may see. The first call initialises the layer
  // lazily from the tensors' batch, heads, head dims (and dtype, unless configured).
  // Throws Error on shape mismatch or when a fixed capacity would be exceeded.
  virtual KVSpan update(const TensorView& k, const TensorView& v) = 0;

  virtual MaskSizes mask_sizes(int64_t query_len) const = 0;
  // Tokens seen so far (positions written), not tokens kept.
  virtual int64_t seq_length() const = 0;
  // Fixed capacity in tokens, or -1 where there is none (dynamic) or it does not apply.
  virtual int64_t max_length() const = 0;
  virtual bool is_initialized() const = 0;

  // transformers v5's rule (cache/crop_rule.h): n < 0 drops the last |n| tokens (all of them,
  // no error, when |n| >= seq_length()); crop(0) drops nothing but shrinks a layer that records
  // its past back to its working size; n > 0, deprecated (warns once), keeps the first n
  // (no-op when n >= seq_length()). Crop to 0 always succeeds; a container that cannot return
  // to another length (a window past its recorded keys, a lossy eviction, a recurrent state
  // without a snapshot) throws Error naming the layer and changes nothing.
  virtual void crop(int64_t n) = 0;
  // Forget the content, keep the memory (multi-turn reuse without reallocation).
  virtual void reset() = 0;
  // Batch row i becomes old row beam_idx[i] (beam search). Size must equal the batch.
  virtual void reorder(std::span<const int64_t> beam_idx) = 0;
  // Each batch row repeated r times consecutively (batch grows r-fold).
  virtual void repeat_interleave(int64_t r) = 0;
  // Keep only the listed batch rows, in the listed order (batch shrinks).
  virtual void select(std::span<const int64_t> indices) = 0;

  // Keep every token from now on, even those a window would evict, so that a later crop()
  // may go back (speculative decoding, transformers' activate_past_recording). Does not
  // change what update() returns. No-op for containers that keep everything anyway.
  virtual void activate_past_recording() {}

  // Capacity hint: room for `tokens` tokens per batch row, so that growing to that length
  // reallocates nothing (llama.cpp sizes its cache from n_ctx up front; a growing container
  // otherwise copies everything it holds each time it doubles). Content, spans' values and
  // seq_length() are unchanged; earlier spans' pointers may be invalidated. No-op for
  // containers whose memory is fixed at construction or bounded by a window.
  virtual void reserve(int64_t tokens) { (void)tokens; }

  // Tiering hooks (transformers' CacheLayerMixin.offload / prefetch): no-ops unless the container
  // moves memory between tiers (cache/offloaded_layer.h). prefetch() starts bringing the layer's
  // K/V back to the resident tier without waiting (update() waits); offload() gives the resident
  // copy up (the layer's last span is then invalid). offloadable(): the Cache drives the hooks
  // for this layer around its updates (see Cache::update).
  virtual void offload() {}
  virtual void prefetch() {}
  virtual bool offloadable() const { return false; }

  // Eviction policies that score keys by the attention they receive (cache/evicting_layer.h:
  // H2O, SnapKV) need each step's queries. Model code calls observe_queries() right after the
  // step's attention (or in place of it, when the step only fills the cache) with the queries
  // q [B, H_q, S_new, D_k] (RoPE applied) that read the span update() returned, and the options
  // the kernel was given (scale, softcap, sinks). No other container reads them.
  virtual bool wants_queries() const { return false; }
  virtual void observe_queries(const TensorView& q, const AttentionOptions& options) {
    (void)q;
    (void)options;
  }

  // Exact resident bytes of everything this layer owns (storage, workspaces, metadata arrays).
  virtual size_t bytes() const = 0;
  // Bytes this layer keeps on a lower tier (disk), not counted in bytes(). 0 unless offloaded.
  virtual size_t offloaded_bytes() const { return 0; }

  // Session save / restore (cache/layer_state.h): writes everything needed to continue from
  // here; load() restores it into a layer of the same registry name and configuration (a fresh
  // or reset one), checking every field first (Error(kFormat) naming the layer and what
  // differs). Containers that cannot be saved throw Error(kUnsupported) naming themselves.
  virtual void save(StateWriter& out) const;
  virtual void load(StateReader& in);
  virtual CopyStats stats() const { return {}; }
  // The registry name of this container, e.g. "dynamic/full_attention".
  virtual std::string_view name() const = 0;

  // transformers v5 parity (Cache::stored_kv, batch_size, is_compileable).
  // What the layer holds, as views over a dense token axis; false when its storage is not one
  // (packed, paged, on disk, a recurrent state) or it holds nothing yet.
  virtual bool stored(KVSpan* out) const {
    (void)out;
    return false;
  }
  // Batch rows held; -1 when unknown (not initialised, or the container does not say).
  virtual int64_t batch_rows() const { return -1; }
  // Fixed shapes and addresses (v5's is_compileable: static layers, linear states).
  virtual bool is_compileable() const { return false; }
};

}  // namespace kvcache
