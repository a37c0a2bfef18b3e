// QuantizedLayer ("quantized" / "full_attention", "sliding_attention" and "chunked_attention"):
// a KIVI-style cache.
// The most recent tokens stay in full precision in a residual buffer; once it holds R tokens
// (QuantizedOptions::residual, default 128) the next update first moves its oldest whole groups
// of G tokens (QuantizedOptions::group, default 64) into the packed store, quantized with
// kernels/kv_quant.h (KIVI: keys per channel, values per token, 2/4/8 bits; or llama.cpp's
// per-token q8_0 / q4_0 for comparison, --kv-quant). update() returns a kQuantized span
// (packed blocks + residual, read in place by the fused dequantizing attention): nothing is
// ever dequantized into a copy. transformers' QuantizedLayer (cache_utils.py:703, KV cache
// notes "Quantized") dequantizes the whole cache on every update and serves full attention
// only; this one does neither.
//
// Residual cycle. Let n_res be the residual length before an update. If n_res >= max(R, G) (or
// >= G when R < G), floor(n_res / G) * G oldest residual tokens are flushed first; then the new
// tokens are appended. Decoding one token at a time with R a multiple of G, the residual length
// after update t (1-based) is ((t - 1) mod R) + 1, and packed + residual = seq_length() always.
// The flush is deferred to the next update so that the step that writes a token still reads it
// in full precision (as transformers returns the unquantized keys on the flushing step).
//
// Sliding layers (window W): before an update at position p, packed blocks whose last token is
// before p - W + 1 (the first key the next query may see) are dropped — whole groups only, so
// the span may begin up to G - 1 tokens before the window; the kernel masks them (kv_offset is
// the first kept token's position). Residual tokens are never dropped (at most R + chunk).
// reserve_rollback(r) (speculative decoding) drops only what a query r positions back would
// not see either, so crops removing at most r tokens in all since the last update find their
// keys (at most ceil(r / G) more blocks held); the spans are unchanged but for those blocks,
// which the kernel masks like any block straddling the window.
//
// Chunked layers (chunks of C, Llama-4): a query at p sees keys [floor(p / C) * C, p]. Before
// an update at p, packed blocks whose last token is before c0 = floor(p / C) * C are dropped, as
// for a sliding layer; when that leaves no packed block, the residual's tokens before c0 are
// dropped too (nothing older is held, so the store stays one contiguous run) and the next
// flush's groups start at c0. A kept block may straddle c0 (< G tokens of the finished chunk,
// masked by the kernel: AttentionOptions::chunk_size, kv_offset = first kept token); when G
// divides C the groups start at chunk starts and none ever does, so each update starts from
// exactly the tokens of the current chunk, like the dense chunked container
// (cache/window_layer.h), which drops a finished chunk at the end of the step that finished it
// (here at the start of the next one: the drop is deferred with the flush).
//
// MLA latents (DeepSeek-V2/V3, CacheConfig::KVContent::kMlaLatent; KV cache notes, "MLA"): the
// model hands the one-head latent c_kv [B, 1, S, d_c] as K and the rotated key k_rot
// [B, 1, S, d_r] as V, stored like any one-head K and V — KIVI per channel over G tokens on
// c_kv, per token (groups of v_group channels) on k_rot. Why this way round: c_kv leaves an
// RMSNorm with a learned per-channel weight (kv_a_layernorm), so its channels differ in scale
// and a per-channel step fits each (KIVI's argument for keys); it is the larger part (512 of
// 576 values per token in V3), and it feeds k_nope and v alike through kv_b. The swap would put
// c_kv per token, one step per v_group channels spanning the outlier channels. k_rot per token
// is what remains; with G >= d_r one step covers a token's d_r values (not measured on real
// DeepSeek weights). The MLA step reads the span through read_kv_rows
// (kernels/kv_span_rows.h), which dequantizes the packed blocks into the step's f32 workspace
// — an explicit copy of the visible rows per layer and step, which the f32 expansion through
// kv_b makes anyway for a dense f16 span.
// Error bound: a packed element is within half a step of its value, |c^ - c| <= D_c / 2 with
// D_c = (max - min) / (2^b - 1) of channel c over its block's G tokens (f16 scale rounded up and
// zero down keep this exact: kernels/kv_quant.h), per token and channel group for k_rot;
// residual rows are exact. Being linear, kv_b carries it to k_nope and v of head h within
// sum_c |W_kv_b[h, i, c]| D_c / 2 per element. Tested: the element bound on MLA shapes, and
// logits against the f32 dynamic cache per bit width (tests/runtime/quantized_layers_test.cc).
//
// Storage (bytes, owned): per batch row and KV head a run of `block capacity` key blocks and
// value blocks ([B][H_kv][cap][block_bytes]), live blocks [begin, end); the residual as f32/f16/
// bf16 tensors [B, H_kv, res_cap, D]; a [G, D] f32 scratch for flushes. bytes() is their sum.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/cache_layer.h"
#include "core/tensor.h"
#include "kernels/kv_quant.h"

namespace kvcache {

struct QuantizedLayerParams {
  std::string name;               // registry name, "quantized/full_attention"
  int layer_index = -1;           // for error messages
  std::optional<DType> kv_dtype;  // residual dtype; unset: the first update's
  // Scheme, code bits, G: tokens per key group, R: full-precision tokens before a flush.
  QuantizedOptions quantized;
  int64_t sliding_window = 0;  // > 0: a sliding layer of window W
  int64_t chunk_size = 0;      // > 0: a chunked layer of chunks of C (at most one of the two)
};

class QuantizedLayer final : public CacheLayer {
 public:
  // Throws Error(kInvalidArgument) naming the layer for bits not in {2, 4, 8}, G < 1, R < 0, or
  // a non-float kv_dtype.
  explicit QuantizedLayer(QuantizedLayerParams params);

  KVSpan update(const TensorView& k, const TensorView& v) override;
  MaskSizes mask_sizes(int64_t query_len) const override;
  int64_t seq_length() const override { return seq_length_; }
  int64_t max_length() const override { return -1; }
  bool is_initialized() const override { return initialized_; }
  // Keeping n tokens that end inside a packed block dequantizes that block's kept tokens back
  // into the residual (their error stays within the block's bound); Error if a sliding layer
  // already dropped tokens the cropped length needs.
  void crop(int64_t n) override;
  // Sliding and chunked layers: keep the blocks (and a chunked layer's residual tokens) a
  // query `tokens` positions back may see (see above). Full attention keeps everything anyway.
  void reserve_rollback(int64_t tokens);
  int64_t rollback() const { return rollback_; }
  void reset() override;
  // Packed-block room for `tokens` tokens (a sliding layer's bounded by its window): grown now
  // when the layer is initialised, else at the first flush.
  void reserve(int64_t tokens) override;
  void reorder(std::span<const int64_t> beam_idx) override;
  void repeat_interleave(int64_t r) override;
  void select(std::span<const int64_t> indices) override;
  size_t bytes() const override;
  std::string_view name() const override { return params_.name; }
  CopyStats stats() const override { return stats_; }
  // Session save / restore: shape, residual dtype, scheme, the packed blocks of every (row,
  // head) and the full-precision residual, byte for byte (nothing is re-quantized).
  void save(StateWriter& out) const override;
  void load(StateReader& in) override;

  int64_t residual_length() const { return n_res_; }
  int64_t packed_length() const { return (blk_end_ - blk_begin_) * params_.quantized.group; }
  int64_t value_group() const { return fmt_.v_group; }
  int64_t packed_capacity_blocks() const { return blk_cap_; }  // per (b, h)
  int64_t residual_capacity() const { return res_k_.shape().ndim == 4 ? res_k_.dim(2) : 0; }
  // Absolute position of the first token held (packed or residual).
  int64_t first_position() const { return seq_length_ - n_res_ - packed_length(); }

 private:
  std::string where() const;
  void init(const TensorView& k, const TensorView& v);
  // First position a query at p (or later) may see: 0, p - W + 1 or floor(p / C) * C.
  int64_t window_start(int64_t p) const;
  bool windowed() const { return params_.sliding_window > 0 || params_.chunk_size > 0; }
  // Blocks a sliding or chunked layer drops before writing at position p.
  int64_t blocks_to_drop(int64_t p) const;
  // Residual tokens a chunked layer drops before writing at p (after blocks_to_drop(p) blocks):
  // those before the chunk start, once no packed block is left.
  int64_t residual_to_drop(int64_t p) const;
  void drop_residual_front(int64_t tokens);  // the oldest `tokens` residual rows, slots shift
  void flush(int64_t tokens);  // oldest `tokens` (a multiple of G) residual tokens -> blocks
  // Room for `extra` more blocks; growing doubles (or reaches reserved_blocks_), unless `exact`.
  void reserve_blocks(int64_t extra, bool exact = false);
  void reserve_residual(int64_t tokens);
  void gather(std::span<const int64_t> rows);
  std::byte* k_block(int64_t b, int64_t h, int64_t i) {
    return kbuf_.data() + ((b * heads_ + h) * blk_cap_ + i) * k_block_bytes_;
  }
  std::byte* v_block(int64_t b, int64_t h, int64_t i) {
    return vbuf_.data() + ((b * heads_ + h) * blk_cap_ + i) * v_block_bytes_;
  }

  QuantizedLayerParams params_;
  bool initialized_ = false;
  int64_t batch_ = 0, heads_ = 0, dk_ = 0, dv_ = 0;
  DType res_dtype_ = DType::kF32;
  KVBlockFormat fmt_;  // set by init() from the first update's shapes
  int64_t k_block_bytes_ = 0, v_block_bytes_ = 0;
  int64_t blk_cap_ = 0, blk_begin_ = 0, blk_end_ = 0;  // per (b, h) block slots
  int64_t reserved_blocks_ = 0;                        // the largest reserve(), in blocks
  ByteBuffer kbuf_, vbuf_;                             // [B][H_kv][blk_cap][block bytes]
  Tensor res_k_, res_v_;                               // [B, H_kv, res_cap, D], slots [0, n_res)
  int64_t n_res_ = 0;
  std::vector<float> scratch_;  // [G, max(D_k, D_v)] f32 rows for quantize / dequantize
  int64_t seq_length_ = 0;
  int64_t rollback_ = 0;  // reserve_rollback
  CopyStats stats_;
};

}  // namespace kvcache
