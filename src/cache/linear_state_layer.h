// LinearStateLayer ("dynamic" / "linear_attention", "static" / "linear_attention"): the cache of
// a Gated DeltaNet layer (Qwen3-Next), which keeps no keys or values but a fixed-size state per
// batch row: the causal conv's window (the last K-1 conv inputs, [K-1, C], what
// kernels/causal_conv.h carries) and the recurrent state [H_v, d_k, d_v] (kernels/gated_delta.h),
// both f32, shapes from CacheConfig::linear. Follows transformers v5's LinearAttentionLayer
// (cache_utils.py): update_conv_state / update_recurrent_state store and return the state,
// has_previous_state tells a prefill from a continuation, reset zeroes in place, reorder /
// select / repeat_interleave act on batch rows, max_length is -1.
//
// Storage: allocated once (at construction when max_batch_size is set, else at the first
// update, for that batch) and never moved by updates, reset, crop, reorder or select: the
// views returned stay valid and the kernels may update the state in place. Only a batch larger
// than the rows allocated reallocates ("dynamic"); "static" refuses it (Error), so its address
// is stable for the object's lifetime, as graph capture needs.
//
// Differences from transformers: the conv window keeps K-1 inputs, token-major, not [C, K]
// (the kernel's layout; the oldest of transformers' K columns is never read again).
// update_conv_state returns the window before and after the new inputs instead of their
// concatenation: the conv kernel reads the left context from `previous` (a copy it may
// overwrite) while the stored window is already the new one. seq_length() counts the tokens
// given to update_conv_state (transformers' linear layers count none; Cache::seq_length() with
// no layer uses an attention layer, as transformers does).
//
// crop: transformers keeps all conv inputs while past recording is on and cuts them back on
// crop; its recurrent state cannot go back at all. Here, with past recording on (from position
// r0, activate_past_recording()), every conv input from r0 is kept, so the window at any
// position p >= r0 can be rebuilt, and the recurrent state is kept at chosen positions:
// snapshot() (and activate_past_recording(), at r0) copy it. crop to p then needs p >= r0 and a
// snapshot at p (speculative decoding: snapshot before the verify forward, crop back to it and
// re-run the accepted tokens); anything else is an Error naming the positions it could go back
// to, never a wrong state. crop to 0 (the zero state) and to seq_length() always work. Every
// crop that keeps tokens, crop(0) included, then shrinks the recording back to its working
// size (v5: conv states cut back to conv_kernel_size): the inputs and snapshots before the new
// length are dropped and recording restarts there, so a later crop returns at most to it.
// With CacheOptions::linear_state.auto_snapshots = N > 0, every update_recurrent_state while
// recording snapshots too and only the newest N snapshots are kept (the conv inputs before the
// oldest are dropped), so crop() can return to any of the last N forward boundaries in
// bounded memory.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/cache_layer.h"
#include "core/tensor.h"

namespace kvcache {

// What update_conv_state returns: views, valid until the next mutating call on the layer.
struct ConvStateUpdate {
  // [B, K-1, C] f32: the window before the new inputs, a copy in the layer's workspace: the
  // conv kernel's `state` argument (it may rewrite it; the layer does not read it again).
  TensorView previous;
  // [B, K-1, C] f32: the stored window, the last K-1 inputs of (previous, x).
  TensorView state;
};

// The linear-attention face every container of "linear_attention" layers shows the model and
// Cache (transformers v5's LinearAttentionCacheLayerMixin): LinearStateLayer (dynamic, static)
// and PagedLinearLayer (paged, cache/paged_linear_layer.h).
class LinearCacheLayer : public CacheLayer {
 public:
  // x: the new conv inputs [B, T, C]; see LinearStateLayer::update_conv_state.
  virtual ConvStateUpdate update_conv_state(const TensorView& x) = 0;
  // state [B, H_v, d_k, d_v]; returns the stored state (no copy when state is it).
  virtual TensorView update_recurrent_state(const TensorView& state) = 0;
  // The batch's stored states, [B, K-1, C] and [B, H_v, d_k, d_v] f32, writable.
  virtual TensorView conv_state() const = 0;
  virtual TensorView recurrent_state() const = 0;
  virtual bool has_previous_state() const = 0;
  virtual const LinearStateShape& shape() const = 0;
  // The Error crop(n) would throw, without changing anything.
  virtual void check_crop(int64_t n) const = 0;
  // Keep the state at seq_length() so that crop() may come back here (Error where the
  // container cannot).
  virtual void snapshot() = 0;
};

struct LinearStateParams {
  std::string name;            // registry name, "dynamic/linear_attention"
  int layer_index = -1;        // model layer, for error messages
  LinearStateShape shape;      // checked at construction
  int64_t max_batch_size = 0;  // rows allocated at construction (0: the first update's batch)
  bool fixed_rows = false;     // never reallocate: a larger batch is an Error (static)
  int64_t auto_snapshots = 0;  // LinearStateOptions::auto_snapshots
  // "recompute": every update_conv_state starts a new sequence from the zero state (reset()
  // first), as RecomputeLayer keeps only the current call's keys: the no-cache forward.
  bool per_call = false;
};

class LinearStateLayer final : public LinearCacheLayer {
 public:
  // Throws Error naming the layer when the shape is missing or invalid.
  explicit LinearStateLayer(LinearStateParams params);

  // A linear layer stores no keys or values: Error naming the layer type (model code calls
  // update_conv_state / update_recurrent_state for it).
  KVSpan update(const TensorView& k, const TensorView& v) override;
  // Error: there is no attention mask for a linear layer.
  MaskSizes mask_sizes(int64_t query_len) const override;
  int64_t seq_length() const override { return seq_; }
  int64_t max_length() const override { return -1; }
  bool is_initialized() const override { return rows_ > 0; }

  // x: the new conv inputs [B, T, C] (any float dtype, converted to f32), T >= 1. The stored
  // window becomes the last K-1 inputs of (window, x); seq_length() grows by T; with past
  // recording on, x is kept for crop(). The batch must match the stored one unless the layer is
  // empty (seq_length() 0), where it may change.
  ConvStateUpdate update_conv_state(const TensorView& x) override;
  // state: [B, H_v, d_k, d_v], any float dtype. Copied into the stored state (no copy when it is
  // the stored state itself, e.g. recurrent_state() updated in place by the kernel); returns
  // the stored state [B, H_v, d_k, d_v] f32.
  TensorView update_recurrent_state(const TensorView& state) override;
  // The stored states, [B, K-1, C] and [B, H_v, d_k, d_v] f32 (writable: the kernels update
  // them in place). Error before the first update.
  TensorView conv_state() const override;
  TensorView recurrent_state() const override;
  // True once update_conv_state or update_recurrent_state has run since construction, reset()
  // or a crop to 0 (transformers sets it on the conv update; a layer that only has a recurrent
  // state counts too).
  bool has_previous_state() const override { return has_previous_; }
  int64_t batch() const { return batch_; }
  int64_t batch_rows() const override { return batch_ > 0 ? batch_ : -1; }
  // Fixed-size states at stable addresses (v5's LinearAttentionCacheLayerMixin.is_compileable).
  bool is_compileable() const override { return true; }
  const LinearStateShape& shape() const override { return params_.shape; }

  // cache/crop_rule.h's rule (n < 0 drops the last |n|, 0 keeps all, n > 0 keeps the first n).
  // See the header comment for which positions can be restored; Error (nothing changed)
  // otherwise.
  void crop(int64_t n) override;
  // The Error crop(n) would throw, without changing anything (Cache checks all linear layers
  // before cropping any layer).
  void check_crop(int64_t n) const override;
  // Zeroes both states in place (same addresses); seq_length() 0; drops history and snapshots
  // (past recording stays on).
  void reset() override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  // From now on keep every conv input, and snapshot the recurrent state now.
  void activate_past_recording() override;
  bool is_recording() const { return recording_; }
  // Copies the recurrent state at seq_length(), so that crop() may come back here. Error unless
  // past recording is on (without it the conv window could not be rebuilt).
  void snapshot() override;
  // Positions crop() can restore besides 0 and seq_length(), ascending.
  std::vector<int64_t> snapshot_positions() const;

  // States, workspace, recorded conv inputs and snapshots.
  size_t bytes() const override;
  std::string_view name() const override { return params_.name; }
  // Session save / restore: the conv window and recurrent state of every row and the position.
  // Past recording's history and snapshots are not saved: after a restore, crop() cannot go
  // back before the restored position.
  void save(StateWriter& out) const override;
  void load(StateReader& in) override;

 private:
  std::string where() const;
  int64_t window() const { return params_.shape.conv_kernel - 1; }
  int64_t conv_row_elems() const { return window() * params_.shape.conv_dim; }
  int64_t rec_row_elems() const;
  // [batch_, ...] view of a state's storage; Error naming `what` before the first update.
  TensorView rows_in_use(const Tensor& storage, const char* what) const;
  // Allocates (or, dynamic, grows) storage for `batch` rows; sets batch_. Changes the batch only
  // while empty; Error naming both batches otherwise.
  void ensure_rows(int64_t batch, const char* op);
  void allocate(int64_t rows);
  // Row i becomes old row rows[i] in every state, the history and the snapshots.
  void gather(std::span<const int64_t> rows, const char* op);
  // Restarts the history with the current window at the current position.
  void restart_history();
  int64_t crop_target(int64_t n) const;
  // Past recording: drops the conv inputs and snapshots before seq_ (crop's last step).
  void shrink_to_working_size();
  // auto_snapshots: keeps the newest ones and drops the conv inputs no crop can use any more.
  void forget_oldest_snapshots();

  LinearStateParams params_;
  int64_t rows_ = 0;   // rows allocated
  int64_t batch_ = 0;  // rows in use
  int64_t seq_ = 0;
  bool has_previous_ = false;
  Tensor conv_;  // [rows_, K-1, C]
  Tensor rec_;   // [rows_, H_v, d_k, d_v]
  Tensor ws_;    // [rows_, K-1, C]: ConvStateUpdate::previous
  bool recording_ = false;
  int64_t record_from_ = 0;  // r0: the position history_ starts at
  // Conv inputs of positions [r0 - (K-1), seq_), token-major [t][b][c]: the window at r0 first.
  std::vector<float> history_;
  std::map<int64_t, std::vector<float>> snapshots_;  // position -> [B, H_v, d_k, d_v]
};

}  // namespace kvcache
