// Fused dequantizing attention over a quantized KV span (core/kv_span.h QuantKV): one online
// softmax over the packed blocks, read in place block by block (codes widened in registers,
// scales and zero points folded into the query and the probabilities), followed by the
// full-precision residual. No dequantized copy of the cache is ever made.
//
// Folding (KIVI layout, kernels/kv_quant.h). Keys are per channel within a block of G tokens:
//   q . k_j = sum_d q_d (s_d c_jd + z_d) = sum_d (q_d s_d) c_jd + sum_d q_d z_d,
// so each block costs one [rows, D] product q' = q * s and one dot q . z, then pure code FMAs.
// Values are per token over channel groups: sum_j p_j (s_jg c_jd + z_jg) =
//   sum_j (p_j s_jg) c_jd + sum_j p_j z_jg,
// so P.V runs on codes with per-(row, key, group) weights p' = p * s plus one zero term per
// (row, group) and tile.
//
// 2- and 4-bit key blocks take the dots in integers: per block and query row, q' = q * s (f32)
// is rounded to int8 with one scale per row, sq = max_d |q'_d| / 127, q'_d ~ sq * nearbyint(q'_d
// * 127 / max), and sum_d (q_d s_d) c_jd becomes sq * (the exact int32 dot of those bytes with
// the codes), 64 products per VNNI instruction instead of 16 per FMA (llama.cpp rounds its
// activations to q8_0 the same way for quantized K). The integer sum is exact, so the scalar,
// AVX2 and AVX-512 paths give the same bits. The rounding moves a logit by at most
// sq / 2 * sum_d c_jd (before the softmax scale), so the output by at most (e^(2 eps) - 1) max |v|
// for eps the largest such move; at 4 bits that is a small part of the keys' own quantization
// error (a code step is (max - min) / 15 of the block's channel; a query step max |q'| / 127).
// Rows whose largest |q'| is below 2^-100 count as zero; a non-finite row gets sq = NaN.
// 8-bit key blocks round q' to int16 instead (an int8 query would double their error), with
// L = min(32767, (2^31 - 1) / (255 D_k)) levels so that the int32 sum cannot overflow, and dot
// two channels per 32-bit lane (vpdpwssd; vpmaddwd on AVX2). The same bound holds with L for
// 127; on unit-scale inputs the outputs move by 1-4e-5 against f32 dots (the tests), where the
// 8-bit codes' own rounding moves them by ~1e-2.
//
// 4-bit value blocks whose channel groups are whole 32-channel slabs (G <= 4,096), and 8-bit
// ones whose groups are whole 16-channel slabs, take P.V in integers the same way: per block,
// value group and row, the weights w_j = p_j * s_jg (f32) are rounded to int16 with one scale,
// step = max_j |w_j| / L, w_j ~ step * nearbyint(w_j * L / max) (L = 32767; at 8 bits
// min(32767, (2^31 - 1) / (255 G))), and sum_j w_j c_jd becomes step * (the exact int32 sum of
// those weights times the codes), two keys per 32-bit lane (vpdpwssd on AVX-512 VNNI, vpmaddwd
// on AVX2): same bits on every path. Each weight moves by at most half a step, so output channel
// d by at most sum over blocks of (max_j w_j / 2L) * sum_j c_jd (normalised): about 5e-5 for
// 4-bit values of unit scale, where their own rounding is near 0.1. A max below 2^-100 counts as
// zero; a non-finite weight gives step = NaN. The zero terms sum_j p_j z_jg stay in f32.
//
// Tolerance (tests): against the double-precision attention reference run on the dequantized
// K/V (dequantize_quant_kv), with the packed logits restated by the rule above,
// |out - ref| <= 1e-5 plus the value weights' bound (integer P.V) for inputs of unit scale; and
// against the reference's exact logits, within both bounds.
#pragma once

#include "core/kv_span.h"
#include "core/tensor.h"
#include "kernels/attention.h"

namespace kvcache {

// q:   [B, H_q, S_q, D_k] f32, unit innermost stride (H_q a multiple of kv.heads)
// kv:  packed blocks + residual, S_kv = kv.seq_len(); key t sits at kv_offset + t
// out: [B, H_q, S_q, D_v] f32, unit innermost stride
// Honoured options: scale, causal, sliding_window, chunk_size (with chunk_offset), softcap,
// sinks, kv_offset,
// q_offset, kv_split. Error(kUnsupported) for mask, score, doc_ids, kv_valid_*, weights_out.
// A query row that sees no key (and has no sink) produces zeros. Uses default_pool().
void quantized_attention(const TensorView& q, const QuantKV& kv, const TensorView& out,
                         const AttentionOptions& options);
// The portable scalar path of the same kernel (tests; what non-AVX2 builds run).
void quantized_attention_scalar(const TensorView& q, const QuantKV& kv, const TensorView& out,
                                const AttentionOptions& options);

// Shapes, scheme and options; throws Error naming the bad field. The kernels call it first.
void validate_quantized_attention_args(const TensorView& q, const QuantKV& kv,
                                       const TensorView& out, const AttentionOptions& options);

// Tests and references only — the expensive copy the kernel exists to avoid: the whole span
// dequantized to f32 k [B, H_kv, S_kv, D_k] and v [B, H_kv, S_kv, D_v].
void dequantize_quant_kv(const QuantKV& kv, Tensor* k, Tensor* v);

}  // namespace kvcache
