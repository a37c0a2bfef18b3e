#include "model/deepseek_v4_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "cache/compressed_cache_layer.h"
#include "core/error.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "kernels/sparse_attention.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

V4CompressorWeights load_compressor(Weights& w, int64_t l, const std::string& prefix, int64_t width,
                                    int64_t d) {
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, prefix + suffix); };
  V4CompressorWeights c;
  c.kv_proj = w.matrix(name("kv_proj.weight"));
  c.gate_proj = w.matrix(name("gate_proj.weight"));
  c.position_bias = w.vector(name("position_bias"));
  c.kv_norm = w.vector(name("kv_norm.weight"));
  c.width = width;
  c.d = d;
  return c;
}

// A [rows, cols] view of `rows` rows of a row-major matrix starting at row `first`.
TensorView row_block(const TensorView& m, int64_t first, int64_t rows, int64_t cols) {
  auto* p = static_cast<std::byte*>(m.data()) + dtype_bytes(m.dtype(), first * cols);
  return TensorView(p, m.dtype(), {rows, cols});
}

}  // namespace

V4AttentionWeights V4AttentionWeights::hf(Weights& w, int64_t l) {
  const ModelConfig& c = w.config();
  const DeepseekV4Config& v = c.deepseek_v4;
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, suffix); };
  V4AttentionWeights a;
  a.q_a = w.matrix(name("self_attn.q_a_proj.weight"));
  a.q_a_norm = w.vector(name("self_attn.q_a_norm.weight"));
  a.q_b = w.matrix(name("self_attn.q_b_proj.weight"));
  a.kv_proj = w.matrix(name("self_attn.kv_proj.weight"));
  a.kv_norm = w.vector(name("self_attn.kv_norm.weight"));
  a.o_a = w.matrix(name("self_attn.o_a_proj.weight"));
  a.o_b = w.matrix(name("self_attn.o_b_proj.weight"));
  a.sinks = w.vector(name("self_attn.sinks"));
  const std::string& type = c.layer_types[static_cast<size_t>(l)];
  const int64_t D = c.head_dim, ci = v.index_head_dim;
  if (type == "compressed_sparse_attention") {
    a.compressor = load_compressor(w, l, "self_attn.compressor.", 2 * D, D);
    a.indexer = load_compressor(w, l, "self_attn.compressor.indexer.", 2 * ci, ci);
    a.index_q_b = w.matrix(name("self_attn.compressor.indexer.q_b_proj.weight"));
    a.index_weights = w.matrix(name("self_attn.compressor.indexer.scorer.weights_proj.weight"));
  } else if (type == "heavily_compressed_attention") {
    a.compressor = load_compressor(w, l, "self_attn.compressor.", D, D);
  }
  return a;
}

DeepseekV4Attention::DeepseekV4Attention(const ModelConfig& config, int64_t layer,
                                         const V4AttentionWeights& w, const float* main_rope,
                                         const float* compress_rope, const float* ones)
    : c_(config),
      layer_(layer),
      w_(w),
      H_(config.n_heads),
      D_(config.head_dim),
      rd_(config.rope_dim()),
      rate_(config.deepseek_v4.rate_of(config.layer_types[static_cast<size_t>(layer)])),
      csa_(config.layer_types[static_cast<size_t>(layer)] == "compressed_sparse_attention"),
      compressed_(rate_ > 0),
      main_rope_(main_rope),
      compress_rope_(compress_rope),
      ones_(ones) {}

void DeepseekV4Attention::rope_trailing(float* x, int64_t n, int64_t n_heads, int64_t head_dim,
                                        int64_t ld, int64_t first, int64_t step, bool compress_rope,
                                        bool inverse) const {
  // apply_rotary_pos_emb: interleaved pairs of the last rd dims of each head ([nope | rope]);
  // the inverse (cos, -sin) is the rotation at -position.
  RopeParams p;
  p.n_tokens = 1;
  p.n_heads = n_heads;
  p.head_dim = head_dim;
  p.ld_token = ld;
  p.rot_dim = rd_;
  p.style = RopeStyle::kInterleaved;
  p.inv_freq = compress_rope ? compress_rope_ : main_rope_;
  p.attention_factor = compress_rope ? c_.deepseek_v4.compress_attention_factor : 1.0f;
  for (int64_t t = 0; t < n; ++t) {
    p.x = x + t * ld + (head_dim - rd_);
    const int64_t pos = first + t * step;
    p.pos0 = inverse ? -pos : pos;
    rope_apply(p);
  }
}

void DeepseekV4Attention::fold(const V4CompressorWeights& c, const float* kv, int64_t kv_ld,
                               const float* gate, int64_t gate_ld, const float* prior_kv,
                               int64_t prior_kv_ld, const float* prior_gate, int64_t prior_gate_ld,
                               int64_t n_windows, float* entries) const {
  // DeepseekV4HCACompressor / DeepseekV4CSACompressor.forward: per window and channel, the
  // softmax (f32) over its slots of gate + position_bias weights the kv rows. CSA slots: the
  // previous window's Ca half (channels [0, d)), then this window's Cb half ([d, 2d)); the
  // first window's previous half comes from the cache (prior; absent: weight 0).
  const int64_t r = rate_, d = c.d, W = c.width;
  const bool overlap = csa_;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  for (int64_t w = 0; w < n_windows; ++w) {
    float* out = entries + w * d;
    for (int64_t ch = 0; ch < d; ++ch) {
      // Slot j in [0, n): (kv, gate) of slot j.
      const int64_t n = overlap ? 2 * r : r;
      auto slot = [&](int64_t j, float& k, float& g) {
        if (!overlap) {
          k = kv[(w * r + j) * kv_ld + ch];
          g = gate[(w * r + j) * gate_ld + ch] + c.position_bias[j * W + ch];
        } else if (j >= r) {  // Cb of this window
          const int64_t t = j - r;
          k = kv[(w * r + t) * kv_ld + d + ch];
          g = gate[(w * r + t) * gate_ld + d + ch] + c.position_bias[t * W + d + ch];
        } else if (w > 0) {  // Ca of the previous window in this chunk
          k = kv[((w - 1) * r + j) * kv_ld + ch];
          g = gate[((w - 1) * r + j) * gate_ld + ch] + c.position_bias[j * W + ch];
        } else if (prior_kv != nullptr) {  // Ca of the last window of an earlier call
          k = prior_kv[j * prior_kv_ld + ch];
          g = prior_gate[j * prior_gate_ld + ch] + c.position_bias[j * W + ch];
        } else {
          k = 0.0f;
          g = neg_inf;
        }
      };
      float mx = neg_inf, k = 0.0f, g = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        slot(j, k, g);
        mx = std::max(mx, g);
      }
      float den = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        slot(j, k, g);
        den += std::exp(g - mx);
      }
      float acc = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        slot(j, k, g);
        acc += k * (std::exp(g - mx) / den);
      }
      out[ch] = acc;
    }
  }
}

void DeepseekV4Attention::compress(Step& st, int64_t layer, int stream,
                                   const V4CompressorWeights& c, const float* xb, float* kv,
                                   float* gate, float* entries) const {
  const int64_t S = st.S, W = c.width, d = c.d;
  const CompressedStream s = static_cast<CompressedStream>(stream);
  CompressedCacheLayer& cl = st.cache->compressed_layer(static_cast<int>(layer));
  const MatmulParams proj[] = {linear_params(st.linear, xb, st.R, c.kv_proj, nullptr, kv),
                               linear_params(st.linear, xb, st.R, c.gate_proj, nullptr, gate)};
  matmul_group(proj);
  for (int64_t b = 0; b < st.B; ++b) {
    const TensorView kv_rows(kv + b * S * W, DType::kF32, {S, W});
    const TensorView gate_rows(gate + b * S * W, DType::kF32, {S, W});
    const CompressionChunk chunk = cl.store_compression_weights(s, b, kv_rows, gate_rows);
    if (chunk.n_windows == 0) continue;
    KV_CHECK(chunk.kv.ndim() == 2 && chunk.kv.dim(1) == W && chunk.kv.stride(1) == 1 &&
                 chunk.gate.stride(1) == 1 && chunk.kv.dtype() == DType::kF32,
             "deepseek_v4: the cache's compression chunk is not [n, width] f32 rows");
    const float* prior_kv = nullptr;
    const float* prior_gate = nullptr;
    int64_t prior_kv_ld = 0, prior_gate_ld = 0;
    if (csa_) {
      const OverlapPrior prior = cl.update_overlap_state(s, b, chunk);
      if (prior.kv.ndim() == 2) {
        prior_kv = prior.kv.data_as<const float>();
        prior_gate = prior.gate.data_as<const float>();
        prior_kv_ld = prior.kv.stride(0);
        prior_gate_ld = prior.gate.stride(0);
      }
    }
    fold(c, chunk.kv.data_as<const float>(), chunk.kv.stride(0), chunk.gate.data_as<const float>(),
         chunk.gate.stride(0), prior_kv, prior_kv_ld, prior_gate, prior_gate_ld, chunk.n_windows,
         entries);
    norm_rows(entries, entries, chunk.n_windows, d, c_.rms_eps, c.kv_norm);
    // RoPE at each window's first position: first_window_position + i * rate.
    rope_trailing(entries, chunk.n_windows, 1, d, d, chunk.first_window_position, rate_,
                  /*compress_rope=*/true, /*inverse=*/false);
    cl.update_compressor_states(s, b, TensorView(entries, DType::kF32, {chunk.n_windows, d}));
  }
}

int64_t DeepseekV4Attention::forward(Step& st, int64_t layer) const {
  const int64_t B = st.B, S = st.S, R = st.R, H = H_, D = D_;
  const DeepseekV4Config& v = c_.deepseek_v4;
  const int64_t qd = H * D, q_lora = v.q_lora_rank;
  Workspace& ws = *st.ws;
  float* xb = ws.data(kForwardScratch, kXb);
  float* q_res = ws.data(kDeepseekV4Scratch, kV4QRes);
  float* q = ws.data(kDeepseekV4Scratch, kV4Q);
  float* kv = ws.data(kDeepseekV4Scratch, kV4Kv);
  float* out = ws.data(kDeepseekV4Scratch, kV4Out);

  // q_res = q_a_norm(q_a_proj(x)) and kv_proj(x) read the same input.
  const MatmulParams first[] = {linear_params(st.linear, xb, R, w_.q_a, nullptr, q_res),
                                linear_params(st.linear, xb, R, w_.kv_proj, nullptr, kv)};
  matmul_group(first);
  norm_rows(q_res, q_res, R, q_lora, c_.rms_eps, w_.q_a_norm);
  linear(st.linear, q_res, R, w_.q_b, nullptr, q);
  norm_rows(q, q, R * H, D, c_.rms_eps, ones_);  // q_b_norm: unweighted, per head
  norm_rows(kv, kv, R, D, c_.rms_eps, w_.kv_norm);
  // Sliding layers rotate with the main rope, CSA / HCA with the compress one.
  std::vector<int64_t> pos(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    pos[static_cast<size_t>(b)] = st.row_pos(b);
    rope_trailing(q + b * S * qd, S, H, D, qd, st.row_pos(b), 1, compressed_, false);
    rope_trailing(kv + b * S * D, S, 1, D, D, st.row_pos(b), 1, compressed_, false);
  }

  const TensorView kv_view(kv, DType::kF32, {B, 1, S, D}, {S * D, S * D, D, 1});
  const KVSpan window = st.cache->update(static_cast<int>(layer), kv_view, kv_view);

  KVSpan entries;
  SparseAttentionParams ap;
  ap.scale = c_.query_scale > 0 ? c_.query_scale : 1.0f / std::sqrt(static_cast<float>(D));
  ap.sliding_window = c_.sliding_window;
  ap.sinks = w_.sinks;
  if (compressed_) {
    ap.rate = rate_;
    compress(st, layer, static_cast<int>(CompressedStream::kCompressor), w_.compressor, xb,
             ws.data(kDeepseekV4Scratch, kV4CompKv), ws.data(kDeepseekV4Scratch, kV4CompGate),
             ws.data(kDeepseekV4Scratch, kV4Entries));
    if (csa_) {
      compress(st, layer, static_cast<int>(CompressedStream::kIndexer), w_.indexer, xb,
               ws.data(kDeepseekV4Scratch, kV4IdxKv), ws.data(kDeepseekV4Scratch, kV4IdxGate),
               ws.data(kDeepseekV4Scratch, kV4Entries));
    }
    CompressedCacheLayer& cl = st.cache->compressed_layer(static_cast<int>(layer));
    entries = cl.compressed(CompressedStream::kCompressor);
    // No entry emitted yet: a container may return no span at all (no k view); then there is
    // nothing to select from (every query's limit is 0).
    const bool any = entries.kind != KVSpanKind::kDense || entries.k.ndim() != 0;
    if (csa_ && any) {
      // DeepseekV4Indexer: queries q_b_proj(q_res) per index head, rotated with the compress
      // rope at the query positions; weights_proj(x) * index_n_heads^-0.5; scores
      // relu(q . k) * index_head_dim^-0.5 summed with the weights; top index_topk.
      const int64_t HI = v.index_n_heads, ci = v.index_head_dim;
      float* qi = ws.data(kDeepseekV4Scratch, kV4QIdx);
      float* wi = ws.data(kDeepseekV4Scratch, kV4IdxW);
      linear(st.linear, q_res, R, w_.index_q_b, nullptr, qi);
      linear(st.linear, xb, R, w_.index_weights, nullptr, wi);
      const float wscale = static_cast<float>(std::pow(static_cast<double>(HI), -0.5));
      for (int64_t i = 0; i < R * HI; ++i) wi[i] *= wscale;
      for (int64_t b = 0; b < B; ++b)
        rope_trailing(qi + b * S * HI * ci, S, HI, ci, HI * ci, st.row_pos(b), 1, true, false);
      auto* selected = reinterpret_cast<int32_t*>(ws.data(kDeepseekV4Scratch, kV4Selected));
      IndexerParams ip;
      ip.rate = rate_;
      ip.top_k = v.index_topk;
      ip.index_scale = static_cast<float>(std::pow(static_cast<double>(ci), -0.5));
      const TensorView q_index(qi, DType::kF32, {B, S, HI, ci}, {S * HI * ci, HI * ci, ci, 1});
      const TensorView weights(wi, DType::kF32, {B, S, HI}, {S * HI, HI, 1, 1});
      indexer_topk(q_index, weights, cl.compressed(CompressedStream::kIndexer), pos, ip, selected);
      ap.selected = selected;
      ap.top_k = v.index_topk;
    }
  }
  const TensorView q_view(q, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  const TensorView out_view(out, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  sparse_attention(q_view, window, entries, pos, ap, out_view);

  // K == V: the values carried the keys' rotation; undo it at the query position.
  for (int64_t b = 0; b < B; ++b)
    rope_trailing(out + b * S * qd, S, H, D, qd, st.row_pos(b), 1, compressed_, true);

  // DeepseekV4GroupedLinear: group g of heads (contiguous H*D/G dims) through rows
  // [g*o_lora, (g+1)*o_lora) of o_a_proj, into columns of the same range; then o_b_proj.
  const int64_t G = v.o_groups, ol = v.o_lora_rank, gin = qd / G;
  float* oa = ws.data(kDeepseekV4Scratch, kV4OA);
  for (int64_t g = 0; g < G; ++g) {
    MatmulParams p = linear_params(st.linear, out + g * gin, R, row_block(w_.o_a, g * ol, ol, gin),
                                   nullptr, oa + g * ol, qd);
    p.ldy = G * ol;
    matmul(p);
  }
  linear(st.linear, oa, R, w_.o_b, nullptr, xb);
  return R;
}

namespace {
std::vector<ScratchBuffer> v4_buffers(const ModelConfig& c) {
  const DeepseekV4Config& v = c.deepseek_v4;
  if (!v.enabled()) return {};
  const int64_t hc = v.hc_mult, dim = c.dim, D = c.head_dim, ci = v.index_head_dim;
  const int64_t E = c.moe.n_experts, I = c.moe.expert_hidden_dim;
  return {
      {hc * dim, 0},                       // kV4Streams
      {hc * dim, 0},                       // kV4Flat
      {(2 + hc) * hc, 0},                  // kV4Mix
      {v.q_lora_rank, 0},                  // kV4QRes
      {c.n_heads * D, 0},                  // kV4Q
      {D, 0},                              // kV4Kv
      {c.n_heads * D, 0},                  // kV4Out
      {v.o_groups * v.o_lora_rank, 0},     // kV4OA
      {2 * D, 0},                          // kV4CompKv
      {2 * D, 0},                          // kV4CompGate
      {2 * ci, 0},                         // kV4IdxKv
      {2 * ci, 0},                         // kV4IdxGate
      {v.index_n_heads * ci, 0},           // kV4QIdx
      {v.index_n_heads, 0},                // kV4IdxW
      {v.index_topk, 0},                   // kV4Selected (int32)
      {std::max(D, ci), std::max(D, ci)},  // kV4Entries
      {0, 2 * E + 3 * I + dim},            // kV4Moe: logits, scores, gate_up, act, out
      {2 * I, 0},                          // kV4Shared
  };
}
int64_t v4_widest_input(const ModelConfig& c) {
  const DeepseekV4Config& v = c.deepseek_v4;
  return std::max(
      {v.q_lora_rank, v.o_groups * v.o_lora_rank, v.hc_mult * c.dim, c.moe.expert_hidden_dim});
}
}  // namespace

const ScratchKind kDeepseekV4Scratch{"deepseek_v4", &v4_buffers, &v4_widest_input};

}  // namespace kvcache
