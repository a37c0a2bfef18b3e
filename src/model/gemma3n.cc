// Gemma-3n (models/gemma3n/modeling_gemma3n.py: Gemma3nTextModel.forward,
// Gemma3nTextDecoderLayer, Gemma3nTextAltUp, Gemma3nTextLaurelBlock, project_per_layer_inputs):
// its blocks are GQA attention (q/k/v norms, sliding layers on their own RoPE theta, the last
// num_kv_shared_layers layers reading an earlier layer's K/V) and GeGLU MLPs (per-layer sizes,
// activation sparsity), run by its own stack:
//   - AltUp keeps A copies ("streams") of the residual stream: each layer predicts every
//     stream from the others, runs its block on the active one, and a learned correction
//     spreads the block's change back to all of them; the output averages them;
//   - Laurel adds a low-rank residual branch beside the attention;
//   - every layer adds a per-layer input (its own slice of a second token embedding plus a
//     projection of the main embedding) to the inactive streams.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "kernels/activation.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "model/dense_mlp.h"
#include "model/family.h"
#include "model/gqa_attention.h"
#include "model/weight_spec.h"

namespace kvcache {

namespace {

// Model-level tensors.
struct AltUpWeights {
  TensorView embed_per_layer;             // [vocab_pl, L*P]
  TensorView per_layer_projection;        // [L*P, dim]
  const float* per_layer_norm = nullptr;  // [P]
  std::vector<TensorView> proj, unembed;  // A-1 of [dim, dim]
};

// Per-layer tensors around the block.
struct AltUpLayer {
  TensorView router;                     // [A, dim]
  const float* router_norm = nullptr;    // [dim]
  const float* prediction = nullptr;     // [A*A, A]
  const float* correction = nullptr;     // [A, A], clipped to +-altup_coef_clip
  const float* out_scale = nullptr;      // [dim] correct_output_scale
  TensorView laurel_left, laurel_right;  // [rank, dim], [dim, rank]
  const float* laurel_norm = nullptr;    // [dim]
  TensorView ple_gate, ple_proj;         // [P, dim], [dim, P]
  const float* ple_norm = nullptr;       // [dim] post_per_layer_input_norm
};

// streams [A*dim], predictions [A*dim] and per-layer inputs [L*P] per row; two branch buffers
// [max(dim, laurel rank, P)] per row.
const ScratchKind kAltUpScratch{
    "gemma3n altup",
    [](const ModelConfig& c) -> std::vector<ScratchBuffer> {
      const Gemma3nConfig& g = c.gemma3n;
      const int64_t A = g.altup_num_inputs, P = g.hidden_size_per_layer_input;
      const int64_t branch = std::max({c.dim, g.laurel_rank, P});
      return {{A * c.dim, 0}, {A * c.dim, 0}, {c.n_layers * P, 0}, {branch, 0}, {branch, 0}};
    },
    [](const ModelConfig& c) -> int64_t {
      const Gemma3nConfig& g = c.gemma3n;
      int64_t k = std::max(g.laurel_rank, g.hidden_size_per_layer_input);
      for (int64_t h : g.intermediate_sizes) k = std::max(k, h);
      return k;
    }};
enum AltUpBuffer : size_t { kStreams, kPreds, kPle, kG1, kG2 };

// mean(x^2) of a row (AltUp's magnitudes).
float mean_sq(const float* x, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s / static_cast<float>(n);
}

// AltUp's rescale of a projected stream row to a target RMS: x * target / sqrt(max(mean(x^2),
// 1e-5)).
void rescale_row(float* x, int64_t n, float target) {
  const float mag = std::sqrt(std::max(mean_sq(x, n), 1e-5f));
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * target / mag;
}

class AltUpStack final : public Stack {
 public:
  AltUpStack(const ModelConfig& c, AltUpWeights model, std::vector<AltUpLayer> layers)
      : c_(c), g_(c.gemma3n), w_(std::move(model)), layers_(std::move(layers)) {}

  // Every row goes through every layer (no last-rows shortcut): the streams of all rows mix
  // only through attention, but the shortcut was not worth a second decoder loop here.
  int64_t run(Step& st, const std::vector<Block>& blocks, const int32_t* tokens, bool,
              bool) const override;

 private:
  struct Buffers {
    float *x, *xb, *streams, *preds, *ple, *g1, *g2;
  };
  Buffers buffers(Step& st) const;
  float* stream(float* base, const Step& st, int64_t i) const { return base + i * st.R * c_.dim; }
  // ple [R, L*P]: norm(W_pl · e · dim^-0.5) + E_pl[token] · sqrt(P), times 2^-0.5.
  void per_layer_inputs(Step& st, const Buffers& b, const int32_t* tokens) const;
  // Stream 0 is the embedding, the others its projections rescaled to its RMS.
  void spread(Step& st, const Buffers& b) const;
  // tanh(modality_router(router_norm(v) * dim^-1)) for every row of v into out [R, A].
  void modalities(Step& st, const Buffers& b, const AltUpLayer& L, const float* v,
                  float* out) const;
  // pred_b = s_b + sum_a C[b][a] s_a, C = prediction_coefs(modalities(s_0)) as [A, A].
  void predict(Step& st, const Buffers& b, const AltUpLayer& L, float* mods, float* coefs) const;
  // Laurel on the normed input xb: g2 = xb + norm(right(left(xb))).
  void laurel(Step& st, const Buffers& b, const AltUpLayer& L) const;
  // s_i = pred_i + (x - pred_0) * (correction_coefs(modalities(x))[i] + 1).
  void correct(Step& st, const Buffers& b, const AltUpLayer& L, float* mods, float* coefs) const;
  // s_i += norm(proj(gelu(gate(s_0 * scale)) * ple_l)) for i >= 1.
  void add_per_layer_input(Step& st, const Buffers& b, const AltUpLayer& L, int64_t l) const;
  // x = the mean of stream 0 and the others projected back and rescaled to its RMS.
  void unembed(Step& st, const Buffers& b) const;

  const ModelConfig& c_;
  const Gemma3nConfig& g_;
  AltUpWeights w_;
  std::vector<AltUpLayer> layers_;
};

AltUpStack::Buffers AltUpStack::buffers(Step& st) const {
  Workspace& ws = *st.ws;
  return {ws.data(kForwardScratch, kX),     ws.data(kForwardScratch, kXb),
          ws.data(kAltUpScratch, kStreams), ws.data(kAltUpScratch, kPreds),
          ws.data(kAltUpScratch, kPle),     ws.data(kAltUpScratch, kG1),
          ws.data(kAltUpScratch, kG2)};
}

void AltUpStack::per_layer_inputs(Step& st, const Buffers& b, const int32_t* tokens) const {
  const int64_t R = st.R, dim = c_.dim, P = g_.hidden_size_per_layer_input, NL = c_.n_layers;
  float* ple = b.ple;
  linear(st.linear, b.x, R, w_.per_layer_projection, nullptr, ple);
  const float proj_scale = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  for (int64_t i = 0; i < R * NL * P; ++i) ple[i] *= proj_scale;
  norm_rows(ple, ple, R * NL, P, c_.rms_eps, w_.per_layer_norm);
  const float pl_scale = static_cast<float>(std::sqrt(static_cast<double>(P)));
  const float input_scale = 1.0f / std::sqrt(2.0f);  // torch.rsqrt(torch.tensor(2.0))
  const TensorView& E = w_.embed_per_layer;
  const size_t pl_row = dtype_bytes(E.dtype(), NL * P);
  for (int64_t r = 0; r < R; ++r) {
    // Gemma3nModel maps ids outside the per-layer vocabulary to 0.
    const int32_t t = tokens[r] < g_.vocab_size_per_layer_input ? tokens[r] : 0;
    const std::byte* src =
        static_cast<const std::byte*>(E.data()) + static_cast<size_t>(t) * pl_row;
    for (int64_t l = 0; l < NL; ++l) {
      float* dst = ple + r * NL * P + l * P;
      dequantize_row(src + dtype_bytes(E.dtype(), l * P), E.dtype(), b.g2, P);
      for (int64_t i = 0; i < P; ++i) dst[i] = (dst[i] + b.g2[i] * pl_scale) * input_scale;
    }
  }
}

void AltUpStack::spread(Step& st, const Buffers& b) const {
  const int64_t R = st.R, dim = c_.dim;
  std::memcpy(b.streams, b.x, static_cast<size_t>(R * dim) * sizeof(float));
  for (int64_t i = 1; i < g_.altup_num_inputs; ++i) {
    float* si = stream(b.streams, st, i);
    linear(st.linear, b.x, R, w_.proj[static_cast<size_t>(i - 1)], nullptr, si);
    for (int64_t r = 0; r < R; ++r)
      rescale_row(si + r * dim, dim, std::sqrt(mean_sq(b.x + r * dim, dim)));
  }
}

void AltUpStack::modalities(Step& st, const Buffers& b, const AltUpLayer& L, const float* v,
                            float* out) const {
  const int64_t R = st.R, dim = c_.dim, A = g_.altup_num_inputs;
  const float router_scale = 1.0f / static_cast<float>(dim);  // hidden_size ** -1.0
  norm_rows(v, b.g1, R, dim, c_.rms_eps, L.router_norm);
  for (int64_t i = 0; i < R * dim; ++i) b.g1[i] *= router_scale;
  linear(st.linear, b.g1, R, L.router, nullptr, out);
  for (int64_t i = 0; i < R * A; ++i) out[i] = std::tanh(out[i]);
}

void AltUpStack::predict(Step& st, const Buffers& b, const AltUpLayer& L, float* mods,
                         float* coefs) const {
  const int64_t R = st.R, dim = c_.dim, A = g_.altup_num_inputs;
  modalities(st, b, L, b.streams, mods);
  for (int64_t r = 0; r < R; ++r) {
    const float* m = mods + r * A;
    for (int64_t k = 0; k < A * A; ++k) {
      float acc = 0.0f;
      for (int64_t a = 0; a < A; ++a) acc += L.prediction[k * A + a] * m[a];
      coefs[k] = acc;
    }
    for (int64_t j = 0; j < A; ++j) {
      float* pj = stream(b.preds, st, j) + r * dim;
      const float* sj = stream(b.streams, st, j) + r * dim;
      for (int64_t d = 0; d < dim; ++d) {
        float acc = 0.0f;
        for (int64_t a = 0; a < A; ++a)
          acc += stream(b.streams, st, a)[r * dim + d] * coefs[j * A + a];
        pj[d] = acc + sj[d];
      }
    }
  }
}

void AltUpStack::laurel(Step& st, const Buffers& b, const AltUpLayer& L) const {
  const int64_t R = st.R, dim = c_.dim;
  linear(st.linear, b.xb, R, L.laurel_left, nullptr, b.g1);
  linear(st.linear, b.g1, R, L.laurel_right, nullptr, b.g2);
  norm_rows(b.g2, b.g2, R, dim, c_.rms_eps, L.laurel_norm);
  add_inplace(b.g2, b.xb, R * dim);
}

void AltUpStack::correct(Step& st, const Buffers& b, const AltUpLayer& L, float* mods,
                         float* coefs) const {
  const int64_t R = st.R, dim = c_.dim, A = g_.altup_num_inputs;
  const float* active = b.preds;  // altup_active_idx == 0
  modalities(st, b, L, b.x, mods);
  for (int64_t r = 0; r < R; ++r) {
    const float* m = mods + r * A;
    for (int64_t i = 0; i < A; ++i) {
      float acc = 0.0f;
      for (int64_t a = 0; a < A; ++a) acc += L.correction[i * A + a] * m[a];
      coefs[i] = acc + 1.0f;
    }
    for (int64_t i = 0; i < A; ++i) {
      float* si = stream(b.streams, st, i) + r * dim;
      const float* pi = stream(b.preds, st, i) + r * dim;
      for (int64_t d = 0; d < dim; ++d)
        si[d] = (b.x[r * dim + d] - active[r * dim + d]) * coefs[i] + pi[d];
    }
  }
}

void AltUpStack::add_per_layer_input(Step& st, const Buffers& b, const AltUpLayer& L,
                                     int64_t l) const {
  const int64_t R = st.R, dim = c_.dim, P = g_.hidden_size_per_layer_input, NL = c_.n_layers;
  for (int64_t i = 0; i < R * dim; ++i)
    b.g1[i] = g_.altup_correct_scale ? b.streams[i] * L.out_scale[i % dim] : b.streams[i];
  linear(st.linear, b.g1, R, L.ple_gate, nullptr, b.g2);  // [R, P]
  for (int64_t r = 0; r < R; ++r)
    geglu_tanh(b.g2 + r * P, b.ple + r * NL * P + l * P, b.g2 + r * P, P);
  linear(st.linear, b.g2, R, L.ple_proj, nullptr, b.g1);  // [R, dim]
  norm_rows(b.g1, b.g1, R, dim, c_.rms_eps, L.ple_norm);
  for (int64_t i = 1; i < g_.altup_num_inputs; ++i)
    add_inplace(stream(b.streams, st, i), b.g1, R * dim);
}

void AltUpStack::unembed(Step& st, const Buffers& b) const {
  const int64_t R = st.R, dim = c_.dim, A = g_.altup_num_inputs;
  for (int64_t i = 1; i < A; ++i) {
    float* pi = stream(b.preds, st, i);
    linear(st.linear, stream(b.streams, st, i), R, w_.unembed[static_cast<size_t>(i - 1)], nullptr,
           pi);
    for (int64_t r = 0; r < R; ++r)
      rescale_row(pi + r * dim, dim, std::sqrt(mean_sq(b.streams + r * dim, dim)));
  }
  for (int64_t e = 0; e < R * dim; ++e) {
    float acc = b.streams[e];
    for (int64_t i = 1; i < A; ++i) acc += stream(b.preds, st, i)[e];
    b.x[e] = acc / static_cast<float>(A);
  }
}

int64_t AltUpStack::run(Step& st, const std::vector<Block>& blocks, const int32_t* tokens, bool,
                        bool) const {
  const int64_t R = st.R, dim = c_.dim, A = g_.altup_num_inputs;
  const Buffers b = buffers(st);
  st.rows = Step::Rows::kAll;
  per_layer_inputs(st, b, tokens);
  spread(st, b);
  std::vector<float> coefs(static_cast<size_t>(A * A));  // per call, not per token
  std::vector<float> mods(static_cast<size_t>(R * A));
  const float* active = b.preds;  // altup_active_idx == 0
  for (size_t l = 0; l < blocks.size(); ++l) {
    const Block& block = blocks[l];
    const AltUpLayer& L = layers_[l];
    predict(st, b, L, mods.data(), coefs.data());
    norm_rows(active, b.xb, R, dim, c_.rms_eps, block.norms.attn);
    laurel(st, b, L);
    block.attention->forward(st, static_cast<int64_t>(l));  // xb: normed input -> o_proj output
    norm_rows(b.xb, b.xb, R, dim, c_.rms_eps, block.norms.post_attn);
    const float sqrt2 = std::sqrt(2.0f);  // (attn_gated + laurel_output) / math.sqrt(2)
    for (int64_t i = 0; i < R * dim; ++i) b.x[i] = ((active[i] + b.xb[i]) + b.g2[i]) / sqrt2;
    norm_rows(b.x, b.xb, R, dim, c_.rms_eps, block.norms.ffn);
    block.mlp->forward(st, R);
    norm_rows(b.xb, b.xb, R, dim, c_.rms_eps, block.norms.post_ffn);
    add_inplace(b.x, b.xb, R * dim);  // x: the activated stream
    correct(st, b, L, mods.data(), coefs.data());
    add_per_layer_input(st, b, L, static_cast<int64_t>(l));
  }
  unembed(st, b);
  return R;
}

// ---- loading ----

AltUpLayer load_altup_layer(Weights& w, int64_t l) {
  const Gemma3nConfig& g = w.config().gemma3n;
  auto name = [&](const char* suffix) { return hf_layer_tensor(l, suffix); };
  AltUpLayer L;
  L.router = w.matrix(name("altup.modality_router.weight"));
  L.router_norm = w.vector(name("altup.router_norm.weight"));
  L.prediction = w.vector(name("altup.prediction_coefs.weight"));
  // Gemma3nTextAltUp.correct clamps correction_coefs to +-altup_coef_clip (also at inference).
  std::vector<float> correction = w.read(name("altup.correction_coefs.weight"));
  if (g.altup_coef_clip > 0)
    for (float& x : correction) x = std::clamp(x, -g.altup_coef_clip, g.altup_coef_clip);
  L.correction = w.keep(std::move(correction));
  L.out_scale = w.vector(name("altup.correct_output_scale"));
  L.laurel_left = w.matrix(name("laurel.linear_left.weight"));
  L.laurel_right = w.matrix(name("laurel.linear_right.weight"));
  L.laurel_norm = w.vector(name("laurel.post_laurel_norm.weight"));
  L.ple_gate = w.matrix(name("per_layer_input_gate.weight"));
  L.ple_proj = w.matrix(name("per_layer_projection.weight"));
  L.ple_norm = w.vector(name("post_per_layer_input_norm.weight"));
  return L;
}

AltUpWeights load_altup(Weights& w) {
  AltUpWeights a;
  a.embed_per_layer = w.matrix("model.embed_tokens_per_layer.weight");
  a.per_layer_projection = w.matrix("model.per_layer_model_projection.weight");
  a.per_layer_norm = w.vector("model.per_layer_projection_norm.weight");
  for (int64_t i = 0; i + 1 < w.config().gemma3n.altup_num_inputs; ++i) {
    a.proj.push_back(w.matrix("model.altup_projections." + std::to_string(i) + ".weight"));
    a.unembed.push_back(
        w.matrix("model.altup_unembed_projections." + std::to_string(i) + ".weight"));
  }
  return a;
}

// Gemma3nTextMLP._gaussian_topk: std_multiplier = Normal(0, 1).icdf(sparsity), in float; 0
// for a layer without sparsity.
float sparsity_z(float sparsity) {
  if (sparsity <= 0.0f) return 0.0f;
  double z = 0.0;  // Newton on Phi(z) = p (Phi is smooth and increasing)
  for (int it = 0; it < 60; ++it) {
    const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
    const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi);
    z -= (cdf - static_cast<double>(sparsity)) / pdf;
  }
  return static_cast<float>(z);
}

void build(Weights& w, ModelParts& parts) {
  const ModelConfig& c = w.config();
  load_hf_embeddings(w, parts);
  const float* global = rope_table(w);
  // Sliding layers rotate with rope_local_theta (no frequency factors).
  const float* local = c.rope_local_theta > 0.0f
                           ? w.keep(rope_inv_freq(c.rope_dim(), c.rope_local_theta, nullptr))
                           : nullptr;
  std::vector<AltUpLayer> layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Block& block = parts.blocks.emplace_back();
    block.attention = make_hf_gqa(w, l, global, local);
    block.mlp = std::make_unique<DenseMlp>(
        DenseMlpWeights::hf(w, l, "mlp."), c.ffn_act,
        sparsity_z(c.gemma3n.activation_sparsity[static_cast<size_t>(l)]));
    block.norms = load_hf_norms(w, l);
    layers.push_back(load_altup_layer(w, l));
  }
  parts.stack = std::make_unique<AltUpStack>(c, load_altup(w), std::move(layers));
}

std::vector<const ScratchKind*> scratch(const ModelConfig&) {
  return {&kGqaScratch, &kDenseMlpScratch, &kAltUpScratch};
}

}  // namespace

KVCACHE_REGISTER_FAMILY(gemma3n, Family{"gemma3n", {"gemma3n"}, &build, &scratch});

}  // namespace kvcache
