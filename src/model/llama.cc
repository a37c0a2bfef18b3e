#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <numeric>

#include "cache/cache.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/attention_quant.h"
#include "kernels/gemm_packed.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"
#include "kernels/paged_attention.h"
#include "model/weight_spec.h"

namespace kvcache {

const float* LlamaModel::as_f32(const TensorView& t) {
  if (t.dtype() == DType::kF32) return t.data_as<const float>();
  Tensor c = Tensor::empty(DType::kF32, {t.numel()});
  convert_n(t.data(), t.dtype(), c.data(), DType::kF32, static_cast<size_t>(t.numel()));
  converted_.push_back(std::move(c));
  return converted_.back().data_as<const float>();
}

const float* LlamaModel::norm_weight(const TensorView& t) {
  if (!file_->config().norm_add_one) return as_f32(t);
  // Gemma2RMSNorm: output * (1.0 + weight.float()), the sum taken in float.
  Tensor c = Tensor::empty(DType::kF32, {t.numel()});
  convert_n(t.data(), t.dtype(), c.data(), DType::kF32, static_cast<size_t>(t.numel()));
  float* w = c.data_as<float>();
  for (int64_t i = 0; i < t.numel(); ++i) w[i] = 1.0f + w[i];
  converted_.push_back(std::move(c));
  return converted_.back().data_as<const float>();
}

void LlamaModel::load_llama_layer(int64_t l, Layer& L) {
  const ModelConfig& c = file_->config();
  auto get = [&](const char* suffix) { return file_->tensor(layer_tensor(l, suffix)); };
  L.attn_norm = as_f32(get("attn_norm.weight"));
  L.wq = get("attn_q.weight");
  L.wk = get("attn_k.weight");
  L.wv = get("attn_v.weight");
  L.wo = get("attn_output.weight");
  if (c.qkv_bias) {
    L.bq = as_f32(get("attn_q.bias"));
    L.bk = as_f32(get("attn_k.bias"));
    L.bv = as_f32(get("attn_v.bias"));
  }
  L.ffn_norm = as_f32(get("ffn_norm.weight"));
  L.w_gate = get("ffn_gate.weight");
  L.w_up = get("ffn_up.weight");
  L.w_down = get("ffn_down.weight");
}

void LlamaModel::load_hf_layer(int64_t l, Layer& L) {
  // Names and shapes were checked by validate_weights() (model/weight_spec.cc).
  const ModelConfig& c = file_->config();
  auto get = [&](const std::string& suffix) { return file_->tensor(hf_layer_tensor(l, suffix)); };
  L.attn_norm = norm_weight(get("input_layernorm.weight"));
  if (c.mla.enabled()) {
    if (c.mla.q_lora_rank > 0) {
      L.wq_a = get("self_attn.q_a_proj.weight");
      L.q_a_norm = as_f32(get("self_attn.q_a_layernorm.weight"));
      L.wq_b = get("self_attn.q_b_proj.weight");
    } else {
      L.wq = get("self_attn.q_proj.weight");
    }
    L.wkv_a = get("self_attn.kv_a_proj_with_mqa.weight");
    L.kv_a_norm = as_f32(get("self_attn.kv_a_layernorm.weight"));
    L.wkv_b = get("self_attn.kv_b_proj.weight");
  } else {
    L.wq = get("self_attn.q_proj.weight");
    L.wk = get("self_attn.k_proj.weight");
    L.wv = get("self_attn.v_proj.weight");
    if (c.qkv_bias) {
      L.bq = as_f32(get("self_attn.q_proj.bias"));
      L.bk = as_f32(get("self_attn.k_proj.bias"));
      L.bv = as_f32(get("self_attn.v_proj.bias"));
    }
    if (c.attn_sinks) L.sinks = as_f32(get("self_attn.sinks"));
  }
  L.wo = get("self_attn.o_proj.weight");
  if (c.attn_out_bias) L.bo = as_f32(get("self_attn.o_proj.bias"));
  if (c.qkv_norm) {
    L.q_norm = as_f32(get("self_attn.q_norm.weight"));
    L.k_norm = as_f32(get("self_attn.k_norm.weight"));
  }
  const Gemma3nConfig& g = c.gemma3n;
  if (g.enabled()) {
    L.altup_router = get("altup.modality_router.weight");
    L.altup_router_norm = as_f32(get("altup.router_norm.weight"));
    L.altup_prediction = as_f32(get("altup.prediction_coefs.weight"));
    // Gemma3nTextAltUp.correct clamps correction_coefs to +-altup_coef_clip (also at inference).
    const TensorView cc = get("altup.correction_coefs.weight");
    Tensor clipped = Tensor::empty(DType::kF32, {cc.numel()});
    convert_n(cc.data(), cc.dtype(), clipped.data(), DType::kF32, static_cast<size_t>(cc.numel()));
    if (g.altup_coef_clip > 0) {
      for (int64_t i = 0; i < cc.numel(); ++i) {
        float& w = clipped.data_as<float>()[i];
        w = std::clamp(w, -g.altup_coef_clip, g.altup_coef_clip);
      }
    }
    converted_.push_back(std::move(clipped));
    L.altup_correction = converted_.back().data_as<const float>();
    L.altup_out_scale = as_f32(get("altup.correct_output_scale"));
    L.laurel_left = get("laurel.linear_left.weight");
    L.laurel_right = get("laurel.linear_right.weight");
    L.laurel_norm = as_f32(get("laurel.post_laurel_norm.weight"));
    L.ple_gate = get("per_layer_input_gate.weight");
    L.ple_proj = get("per_layer_projection.weight");
    L.ple_norm = as_f32(get("post_per_layer_input_norm.weight"));
    const float sparsity = g.activation_sparsity[static_cast<size_t>(l)];
    if (sparsity > 0.0f) {
      // Gemma3nTextMLP._gaussian_topk: std_multiplier = Normal(0, 1).icdf(sparsity), in float.
      double z = 0.0;  // Newton on Phi(z) = p (Phi is smooth and increasing)
      for (int it = 0; it < 60; ++it) {
        const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
        const double pdf = std::exp(-0.5 * z * z) / std::sqrt(2.0 * std::numbers::pi);
        z -= (cdf - static_cast<double>(sparsity)) / pdf;
      }
      L.sparsity_z = static_cast<float>(z);
    }
  }
  if (c.sandwich_norms) {
    L.post_attn_norm = norm_weight(get("post_attention_layernorm.weight"));
    L.ffn_norm = norm_weight(get("pre_feedforward_layernorm.weight"));
    L.post_ffn_norm = norm_weight(get("post_feedforward_layernorm.weight"));
  } else {
    L.ffn_norm = norm_weight(get("post_attention_layernorm.weight"));
  }
  const MoeConfig& m = c.moe;
  L.moe = m.is_moe_layer(l);
  if (!L.moe) {
    L.w_gate = get("mlp.gate_proj.weight");
    L.w_up = get("mlp.up_proj.weight");
    L.w_down = get("mlp.down_proj.weight");
  } else if (m.router == MoeRouter::kGptOss) {
    L.router = get("mlp.router.weight");
    L.router_bias = as_f32(get("mlp.router.bias"));
    L.gate_up = get("mlp.experts.gate_up_proj");
    L.gate_up_bias = as_f32(get("mlp.experts.gate_up_proj_bias"));
    L.down = get("mlp.experts.down_proj");
    L.down_bias = as_f32(get("mlp.experts.down_proj_bias"));
  } else {
    L.router = get("mlp.gate.weight");
    if (m.router == MoeRouter::kDeepseekV3) L.score_bias = as_f32(get("mlp.gate.e_score_correction_bias"));
    for (int64_t e = 0; e < m.n_experts; ++e) {
      const std::string p = "mlp.experts." + std::to_string(e) + ".";
      L.experts.push_back({get(p + "gate_proj.weight"), get(p + "up_proj.weight"), get(p + "down_proj.weight")});
    }
    if (m.n_shared_experts > 0) {
      L.shared_expert = true;
      L.w_gate = get("mlp.shared_experts.gate_proj.weight");
      L.w_up = get("mlp.shared_experts.up_proj.weight");
      L.w_down = get("mlp.shared_experts.down_proj.weight");
    }
  }
}

LlamaModel::LlamaModel(std::unique_ptr<ModelFile> file) : file_(std::move(file)) {
  KV_CHECK(file_ != nullptr, "LlamaModel needs a model file");
  file_->validate_weights();
  const ModelConfig& c = file_->config();
  const bool canonical = c.is_llama_family();
  tok_embeddings_ = file_->tensor(canonical ? "token_embd.weight" : "model.embed_tokens.weight");
  output_ = c.tie_word_embeddings ? tok_embeddings_ : file_->tensor(canonical ? "output.weight" : "lm_head.weight");
  output_norm_ = canonical ? as_f32(file_->tensor("output_norm.weight")) : norm_weight(file_->tensor("model.norm.weight"));
  for (const TensorView* t : {&tok_embeddings_, &output_}) {
    if (t->dtype() == DType::kQ8_0 && c.dim % 32 != 0) {
      throw Error(ErrorKind::kFormat, file_->path() + ": q8_0 matrices need dim % 32 == 0");
    }
  }
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    if (canonical) {
      load_llama_layer(l, L);
    } else {
      load_hf_layer(l, L);
    }
    const std::string& type = c.layer_types[static_cast<size_t>(l)];
    L.sliding = type == "sliding_attention";
    if (L.sliding) {
      L.span = AttentionSpan::kSliding;
      L.window = c.sliding_window;
    } else if (type == "chunked_attention") {
      L.span = AttentionSpan::kChunked;
      L.window = c.attention_chunk_size;
    }
    for (const TensorView* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.wq_a, &L.wq_b,
                                &L.wkv_a, &L.wkv_b, &L.router}) {
      if (t->ndim() == 2 && t->dtype() == DType::kQ8_0 && t->dim(1) % 32 != 0) {
        throw Error(ErrorKind::kFormat, file_->path() + ": layer " + std::to_string(l) +
                                            ": q8_0 matrix with a row length not a multiple of 32");
      }
    }
  }
  // KV sharing: layers from L - num_kv_shared_layers on read the last earlier non-shared layer
  // of their own type (models/gemma3n/modeling_gemma3n.py, Gemma3nTextAttention.__init__).
  const int64_t first_shared = c.n_layers - c.num_kv_shared_layers;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
    L.kv_source = l;
    if (l < first_shared) continue;
    L.kv_shared = true;
    L.kv_source = -1;
    for (int64_t j = first_shared - 1; j >= 0; --j) {
      if (c.layer_types[static_cast<size_t>(j)] == c.layer_types[static_cast<size_t>(l)]) {
        L.kv_source = j;
        break;
      }
    }
    if (L.kv_source < 0 || c.mla.enabled()) {
      throw Error(ErrorKind::kFormat, file_->path() + ": layer " + std::to_string(l) + " shares KV (num_kv_shared_layers = " +
                                          std::to_string(c.num_kv_shared_layers) +
                                          ") but no earlier non-shared " + (c.mla.enabled() ? "GQA " : "") +
                                          "layer of type '" + c.layer_types[static_cast<size_t>(l)] + "' exists");
    }
    layers_[static_cast<size_t>(L.kv_source)].kv_source_of_shared = true;
  }
  inv_freq_ = ::kvcache::rope_inv_freq(c.rope_dim(), c.rope_theta,
                            c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data());
  if (c.rope_local_theta > 0.0f) inv_freq_local_ = ::kvcache::rope_inv_freq(c.rope_dim(), c.rope_local_theta, nullptr);
  ones_.assign(static_cast<size_t>(c.head_dim), 1.0f);
  for (Layer& L : layers_) {
    const bool local = L.span == AttentionSpan::kSliding && !inv_freq_local_.empty();
    L.rope_inv_freq = local ? inv_freq_local_.data() : inv_freq_.data();
    L.ffn_hidden = L.w_gate.ndim() == 2 ? L.w_gate.dim(0) : 0;
  }
  if (c.gemma3n.enabled()) {
    g3n_.embed_per_layer = file_->tensor("model.embed_tokens_per_layer.weight");
    g3n_.per_layer_projection = file_->tensor("model.per_layer_model_projection.weight");
    g3n_.per_layer_norm = as_f32(file_->tensor("model.per_layer_projection_norm.weight"));
    for (int64_t i = 0; i + 1 < c.gemma3n.altup_num_inputs; ++i) {
      g3n_.altup_proj.push_back(file_->tensor("model.altup_projections." + std::to_string(i) + ".weight"));
      g3n_.altup_unembed.push_back(file_->tensor("model.altup_unembed_projections." + std::to_string(i) + ".weight"));
    }
  }
  // MLA's rotated part: DeepSeek-V2 (view_as_complex on pairs) and V3 with rope_interleave
  // rotate pairs (2i, 2i+1). V3 first permutes them to halves (apply_rotary_pos_emb_interleave)
  // and leaves q_rot/k_rot in that permuted order — the same permutation on both sides, so the
  // scores equal those of interleaved RoPE applied in place, which is what we do.
  if (c.mla.enabled()) {
    rope_style_ = c.mla.rope_interleave ? RopeStyle::kInterleaved : RopeStyle::kHalf;
  } else {
    rope_style_ = c.rope_interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalf;
  }
}

// ---------------------------------------------------------------------------------------------

LlamaForward::LlamaForward(const LlamaModel& model, std::string_view kernel, int64_t max_rows)
    : model_(model), kernel_(kernel), attention_(get_attention_kernel(kernel)) {
  reserve(std::max<int64_t>(1, max_rows));
}

namespace {
// Floats of the prefill GEMM's packed input for `rows` rows: sized for the widest input of any
// linear (none for fewer rows than the GEMM takes, which the GEMV path serves).
int64_t pack_floats(const ModelConfig& c, int64_t rows) {
  if (rows < kBlasMinRows) return 0;
  const int64_t qd = c.n_heads * c.qk_head_dim(), od = c.n_heads * c.v_head_dim();
  const int64_t hidden = std::max({c.hidden_dim, c.moe.expert_hidden_dim * std::max<int64_t>(1, c.moe.n_shared_experts)});
  int64_t k = std::max({c.dim, qd, od, hidden});
  if (c.mla.enabled()) k = std::max({k, c.mla.q_lora_rank, c.mla.kv_lora_rank});
  if (c.gemma3n.enabled()) {
    k = std::max({k, c.gemma3n.laurel_rank, c.gemma3n.hidden_size_per_layer_input});
    for (int64_t h : c.gemma3n.intermediate_sizes) k = std::max(k, h);
  }
  return static_cast<int64_t>(gemm_packed_scratch_floats(rows, k));
}
}  // namespace

void LlamaForward::reserve(int64_t rows) {
  if (rows <= rows_) return;
  const ModelConfig& c = model_.config();
  const int64_t qd = c.n_heads * c.qk_head_dim(), kvd = c.n_kv_heads * c.head_dim;
  const int64_t od = c.n_heads * c.v_head_dim();
  const int64_t hidden = std::max({c.hidden_dim, c.moe.expert_hidden_dim * std::max<int64_t>(1, c.moe.n_shared_experts)});
  x_ = Tensor::empty(DType::kF32, {rows, c.dim});
  xb_ = Tensor::empty(DType::kF32, {rows, std::max({c.dim, qd, od})});
  q_ = Tensor::empty(DType::kF32, {rows, qd});
  if (!c.mla.enabled()) {
    k_ = Tensor::empty(DType::kF32, {rows, kvd});
    v_ = Tensor::empty(DType::kF32, {rows, kvd});
  } else {
    ckv_ = Tensor::empty(DType::kF32, {rows, c.mla.kv_lora_rank + c.mla.qk_rope_head_dim});
    if (c.mla.q_lora_rank > 0) qa_ = Tensor::empty(DType::kF32, {rows, c.mla.q_lora_rank});
  }
  att_ = Tensor::empty(DType::kF32, {rows, std::max({qd, od, c.dim})});  // MoE reuses it as [rows, dim]
  hb_ = Tensor::empty(DType::kF32, {rows, hidden});
  hb2_ = Tensor::empty(DType::kF32, {rows, hidden});
  logits_ = Tensor::empty(DType::kF32, {rows, c.vocab_size});
  if (c.gemma3n.enabled()) {
    const Gemma3nConfig& g = c.gemma3n;
    const int64_t A = g.altup_num_inputs, P = g.hidden_size_per_layer_input;
    streams_ = Tensor::empty(DType::kF32, {A, rows, c.dim});
    preds_ = Tensor::empty(DType::kF32, {A, rows, c.dim});
    ple_ = Tensor::empty(DType::kF32, {rows, c.n_layers * P});
    g1_ = Tensor::empty(DType::kF32, {rows, std::max({c.dim, g.laurel_rank, P})});
    g2_ = Tensor::empty(DType::kF32, {rows, std::max({c.dim, g.laurel_rank, P})});
  }
  if (c.moe.n_experts > 0) {
    // router logits [E] + order [E] + expert output [dim] + gate_up [2I] + one weight row
    const int64_t I = c.moe.expert_hidden_dim;
    moe_scratch_ = Tensor::empty(DType::kF32, {2 * c.moe.n_experts + c.dim + 2 * I + std::max(c.dim, 2 * I)});
  }
  if (const int64_t pf = pack_floats(c, rows); pf > 0) xpack_ = Tensor::empty(DType::kF32, {pf});
  rows_ = rows;
}

size_t LlamaForward::workspace_bytes_for(const ModelConfig& c, int64_t rows) {
  // Mirrors reserve(): the fixed workspaces of `rows` rows (the lazily grown MLA expansion and
  // no-cache KV-sharing buffers start empty and are not counted).
  const int64_t qd = c.n_heads * c.qk_head_dim(), kvd = c.n_kv_heads * c.head_dim;
  const int64_t od = c.n_heads * c.v_head_dim();
  const int64_t hidden = std::max({c.hidden_dim, c.moe.expert_hidden_dim * std::max<int64_t>(1, c.moe.n_shared_experts)});
  int64_t floats = rows * (c.dim + std::max({c.dim, qd, od}) + qd + std::max({qd, od, c.dim}) + 2 * hidden + c.vocab_size);
  if (!c.mla.enabled()) {
    floats += 2 * rows * kvd;
  } else {
    floats += rows * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim);
    if (c.mla.q_lora_rank > 0) floats += rows * c.mla.q_lora_rank;
  }
  if (c.gemma3n.enabled()) {
    const Gemma3nConfig& g = c.gemma3n;
    const int64_t A = g.altup_num_inputs, P = g.hidden_size_per_layer_input;
    floats += 2 * A * rows * c.dim + rows * c.n_layers * P + 2 * rows * std::max({c.dim, g.laurel_rank, P});
  }
  if (c.moe.n_experts > 0) {
    const int64_t I = c.moe.expert_hidden_dim;
    floats += 2 * c.moe.n_experts + c.dim + 2 * I + std::max(c.dim, 2 * I);
  }
  floats += pack_floats(c, rows);
  return static_cast<size_t>(floats) * sizeof(float);
}

size_t LlamaForward::workspace_bytes() const {
  size_t n = 0;
  for (const Tensor* t : {&x_, &xb_, &q_, &k_, &v_, &att_, &hb_, &hb2_, &logits_, &ckv_, &qa_, &lat32_, &kvb_,
                          &kfull_, &moe_scratch_, &streams_, &preds_, &ple_, &g1_, &g2_, &xpack_}) {
    n += t->size_bytes();
  }
  for (const auto* ts : {&src_k_, &src_v_})
    for (const Tensor& t : *ts) n += t.size_bytes();
  return n;
}

float* LlamaForward::grow(Tensor& t, int64_t n) {
  if (t.numel() < n) t = Tensor::empty(DType::kF32, {std::max(n, 2 * t.numel())});
  return t.data_as<float>();
}

namespace {

// Set by LlamaForward::forward for the duration of one call (ForwardParams::batch_invariant);
// thread-local so forwards on different threads do not interfere.
thread_local bool t_batch_invariant = false;
// The forward's packed-input scratch for the prefill GEMM (LlamaForward::xpack_), same scope.
// The tensor, not its data pointer: reserve() may reallocate it during the forward.
thread_local const Tensor* t_pack = nullptr;
// Set for the last layer's kept rows (see forward): MatmulParams::gemm_any_rows.
thread_local bool t_gemm_any_rows = false;

MatmulParams linear_params(const float* x, int64_t rows, const TensorView& w, const float* bias, float* y,
                           int64_t ldx = 0) {
  MatmulParams p;
  p.x = x;
  p.ldx = ldx > 0 ? ldx : w.dim(1);
  p.w = w.data();
  p.w_dtype = w.dtype();
  p.bias = bias;
  p.y = y;
  p.ldy = w.dim(0);
  p.m = rows;
  p.n = w.dim(0);
  p.k = w.dim(1);
  p.allow_blas = !t_batch_invariant;
  p.gemm_any_rows = t_gemm_any_rows;
  if (t_pack != nullptr && t_pack->numel() > 0) {
    p.pack_scratch = t_pack->data_as<float>();
    p.pack_scratch_floats = static_cast<size_t>(t_pack->numel());
  }
  return p;
}

void linear(const float* x, int64_t rows, const TensorView& w, const float* bias, float* y, int64_t ldx = 0) {
  matmul(linear_params(x, rows, w, bias, y, ldx));
}

// For the products in its scope, the kernel a product over `whole_rows` rows takes
// (MatmulParams::gemm_any_rows): the last layer's kept rows keep the bits they have in a
// product over the whole chunk.
struct GemmAsRows {
  bool saved = t_gemm_any_rows;
  explicit GemmAsRows(int64_t whole_rows) {
    MatmulParams whole;
    whole.m = whole_rows;
    whole.allow_blas = !t_batch_invariant;
    t_gemm_any_rows = takes_gemm(whole);
  }
  ~GemmAsRows() { t_gemm_any_rows = saved; }
  GemmAsRows(const GemmAsRows&) = delete;
  GemmAsRows& operator=(const GemmAsRows&) = delete;
};

void add_inplace(float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

// Rows of B blocks of S (width floats each): row S - 1 of block b, the last position of batch
// row b, moves to row b.
void keep_last_rows(float* rows, int64_t B, int64_t S, int64_t width) {
  for (int64_t b = 0; b < B; ++b)
    std::memmove(rows + b * width, rows + (b * S + S - 1) * width,
                 static_cast<size_t>(width) * sizeof(float));
}

// y[out] = x[in] @ W[in, out] (+ bias): GPT-OSS experts store weights input-major. Each W row
// is widened into `row` ([out] scratch) and accumulated, so any weight dtype works.
void linear_in_out(const float* x, int64_t in, const std::byte* w, DType t, int64_t out, const float* bias,
                   float* y, float* row) {
  const size_t row_bytes = dtype_bytes(t, out);
  if (bias) {
    std::memcpy(y, bias, static_cast<size_t>(out) * sizeof(float));
  } else {
    std::fill(y, y + out, 0.0f);
  }
  for (int64_t i = 0; i < in; ++i) {
    dequantize_row(w + static_cast<size_t>(i) * row_bytes, t, row, out);
    const float xi = x[i];
    for (int64_t j = 0; j < out; ++j) y[j] += xi * row[j];
  }
}

void softcap_inplace(float* a, int64_t n, float cap) {
  // Gemma2ForCausalLM: logits / cap -> tanh -> * cap.
  for (int64_t i = 0; i < n; ++i) a[i] = std::tanh(a[i] / cap) * cap;
}

}  // namespace

KVSpan LlamaForward::update_or_share(const Step& st, int64_t l, const TensorView& k, const TensorView& v) {
  KVSpan span;
  if (st.cache == nullptr) {  // shared layers get their source's K/V from attention_gqa
    span.k = k;
    span.v = v;
    span.kv_offset = 0;
  } else if (st.cache->is_shared(static_cast<int>(l))) {
    span = st.cache->shared_kv(static_cast<int>(l));
  } else {
    span = st.cache->update(static_cast<int>(l), k, v);
  }
  return span;
}

void LlamaForward::attention_gqa(const Step& st, int64_t l) {
  const ModelConfig& c = model_.config();
  const LlamaModel::Layer& L = model_.layers()[static_cast<size_t>(l)];
  const int64_t B = st.B, S = st.S, R = st.R, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  const int64_t qd = H * D, kvd = Hkv * D;
  float* xb = xb_.data_as<float>();
  float* q = q_.data_as<float>();
  float* k = k_.data_as<float>();
  float* v = v_.data_as<float>();
  float* att = att_.data_as<float>();
  if (!L.kv_shared) {
    // Q, K and V read the same input: one pass over the thread pool for the three (decode).
    const MatmulParams qkv[] = {linear_params(xb, R, L.wq, L.bq, q), linear_params(xb, R, L.wk, L.bk, k),
                                linear_params(xb, R, L.wv, L.bv, v)};
    matmul_group(qkv);
  } else {
    linear(xb, R, L.wq, L.bq, q);
  }
  if (L.q_norm != nullptr) {
    // Gemma3nTextAttention: q_norm, k_norm (weighted) and v_norm (unweighted) over each head,
    // before RoPE.
    RmsNormParams n;
    n.dim = D;
    n.eps = c.rms_eps;
    n.x = n.y = q;
    n.rows = R * H;
    n.weight = L.q_norm;
    rms_norm(n);
    if (!L.kv_shared) {
      n.rows = R * Hkv;
      n.x = n.y = k;
      n.weight = L.k_norm;
      rms_norm(n);
      n.x = n.y = v;
      n.weight = model_.unit_norm_weight();
      rms_norm(n);
    }
  }
  // RoPE on the new keys only, before they enter the cache: cached keys are never re-rotated.
  RopeParams rope;
  rope.n_tokens = S;
  rope.head_dim = D;
  rope.pos0 = st.pos0;
  rope.inv_freq = L.rope_inv_freq;
  rope.rot_dim = D;
  rope.style = model_.rope_style();
  rope.attention_factor = c.rope_attention_factor;
  for (int64_t b = 0; b < B; ++b) {
    rope.pos0 = st.row_pos(b);
    rope.x = q + b * S * qd;
    rope.n_heads = H;
    rope_apply(rope);
    if (L.kv_shared) continue;
    rope.x = k + b * S * kvd;
    rope.n_heads = Hkv;
    rope_apply(rope);
  }
  if (st.cache == nullptr && L.kv_source_of_shared) {
    // No cache: keep this layer's K/V for the shared layers that read it later in this call.
    const auto src = static_cast<size_t>(l);
    src_k_.resize(model_.layers().size());
    src_v_.resize(model_.layers().size());
    float* sk = grow(src_k_[src], R * kvd);
    float* sv = grow(src_v_[src], R * kvd);
    std::memcpy(sk, k, static_cast<size_t>(R * kvd) * sizeof(float));
    std::memcpy(sv, v, static_cast<size_t>(R * kvd) * sizeof(float));
  }
  if (st.cache == nullptr && L.kv_shared) {
    const auto src = static_cast<size_t>(L.kv_source);
    k = src_k_[src].data_as<float>();
    v = src_v_[src].data_as<float>();
  }
  // Views over the row-major [B*S, heads*D] buffers as [B, heads, S, D]: no transposes.
  const TensorView q_view(q, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  const TensorView k_view(k, DType::kF32, {B, Hkv, S, D}, {S * kvd, D, kvd, 1});
  const TensorView v_view(v, DType::kF32, {B, Hkv, S, D}, {S * kvd, D, kvd, 1});
  const TensorView out_view(att, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  if (st.cache != nullptr && st.cache->source_layer(static_cast<int>(l)) != L.kv_source) {
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(l) + ": the cache shares KV from layer " +
                    std::to_string(st.cache->source_layer(static_cast<int>(l))) + " but the model reads layer " +
                    std::to_string(L.kv_source) + " (build the cache with the model's num_kv_shared_layers)");
  }
  const KVSpan span = update_or_share(st, l, k_view, v_view);

  AttentionOptions opts;
  opts.scale = c.query_scale > 0 ? c.query_scale : 1.0f / std::sqrt(static_cast<float>(D));
  opts.causal = true;
  opts.q_offset = st.pos0;
  opts.kv_offset = span.kv_offset;
  opts.sliding_window = L.span == LlamaModel::AttentionSpan::kSliding ? L.window : 0;
  opts.chunk_size = L.span == LlamaModel::AttentionSpan::kChunked ? L.window : 0;
  opts.softcap = c.attn_softcap;
  opts.sinks = L.sinks;
  if (st.rows == Step::Rows::kKvOnly) return;
  if (st.rows == Step::Rows::kLast) {
    if (span.kind == KVSpanKind::kQuantized) {
      // The quantized kernel: every row, then the last ones gathered (its one-query path is
      // not promised to give a prefill row's bits).
      run_attention(st, span, q_view, out_view, opts);
      keep_last_rows(att, B, S, qd);
    } else {
      // One query per batch row, the chunk's last (a decode row of the fused and eager kernels
      // equals its prefill row), written to rows 0..B-1 of att. As one-row sequences for the
      // paged path: row b of q sits S rows after row b - 1.
      const TensorView q_last(q + (S - 1) * qd, DType::kF32, {B, H, 1, D}, {S * qd, D, S * qd, 1});
      const TensorView out_last(att, DType::kF32, {B, H, 1, D}, {qd, D, qd, 1});
      Step one = st;
      one.S = 1;
      one.R = B;
      opts.q_offset = st.pos0 + S - 1;
      run_attention(one, span, q_last, out_last, opts);
    }
    const GemmAsRows as_chunk(R);
    linear(att, B, L.wo, L.bo, xb);
    return;
  }
  run_attention(st, span, q_view, out_view, opts);
  linear(att, R, L.wo, L.bo, xb);
}

void LlamaForward::run_attention(const Step& st, const KVSpan& span, const TensorView& q_view,
                                 const TensorView& out_view, AttentionOptions opts) {
  opts.workspace = attention_ws_.reserve_for(q_view, span, opts);
  if (span.kind != KVSpanKind::kPaged) {
    if (st.rows_differ)
      throw Error(ErrorKind::kInvalidArgument,
                  "forward: batch rows at different positions need a paged cache (--cache paged)");
    attend_span(attention_, q_view, span, out_view, opts);  // dense or quantized span
    return;
  }
  // The [B, H, S, D] views over row-major [B*S, H*D] buffers are the packed varlen layout
  // [total_q = B*S, H, D] paged_attention takes, sequence b owning rows [b*S, (b+1)*S).
  const int64_t H = q_view.dim(1), D = q_view.dim(3), Dv = out_view.dim(3);
  PagedAttentionArgs pa;
  pa.q = TensorView(q_view.data(), DType::kF32, {st.R, H, D}, {q_view.stride(2), q_view.stride(1), 1});
  pa.out = TensorView(out_view.data(), DType::kF32, {st.R, H, Dv}, {out_view.stride(2), out_view.stride(1), 1});
  pa.kv = span.paged;
  cu_seqlens_q_.resize(static_cast<size_t>(st.B + 1));
  for (int64_t b = 0; b <= st.B; ++b) cu_seqlens_q_[static_cast<size_t>(b)] = static_cast<int32_t>(b * st.S);
  pa.cu_seqlens_q = cu_seqlens_q_.data();
  // Each sequence's queries sit at its own last positions (bottom-right), where row_pos0 put
  // them: the paged kernels take no q_offset.
  opts.q_offset = -1;
  paged_attention(kernel_, pa, opts);
}

void LlamaForward::attention_mla(const Step& st, int64_t l) {
  const ModelConfig& c = model_.config();
  const MlaConfig& m = c.mla;
  const LlamaModel::Layer& L = model_.layers()[static_cast<size_t>(l)];
  const int64_t B = st.B, S = st.S, R = st.R, H = c.n_heads;
  const int64_t dc = m.kv_lora_rank, dr = m.qk_rope_head_dim, dn = m.qk_nope_head_dim, dv = m.v_head_dim;
  const int64_t dqk = dn + dr, qd = H * dqk, ckd = dc + dr, kvbd = dn + dv;
  float* xb = xb_.data_as<float>();
  float* q = q_.data_as<float>();
  float* ckv = ckv_.data_as<float>();
  float* att = att_.data_as<float>();
  // DeepseekV3RMSNorm(q_lora_rank) and (kv_lora_rank) are built with the default eps 1e-6,
  // not config.rms_norm_eps.
  constexpr float kLoraNormEps = 1e-6f;
  if (m.q_lora_rank > 0) {
    float* qa = qa_.data_as<float>();
    linear(xb, R, L.wq_a, nullptr, qa);
    RmsNormParams n;
    n.x = qa;
    n.y = qa;
    n.rows = R;
    n.dim = m.q_lora_rank;
    n.eps = kLoraNormEps;
    n.weight = L.q_a_norm;
    rms_norm(n);
    linear(qa, R, L.wq_b, nullptr, q);
  } else {
    linear(xb, R, L.wq, nullptr, q);
  }
  linear(xb, R, L.wkv_a, nullptr, ckv);  // [R, d_c + d_r]: latent | k_rot
  RmsNormParams n;
  n.x = ckv;
  n.y = ckv;
  n.rows = R;
  n.dim = dc;
  n.ld_x = ckd;
  n.ld_y = ckd;
  n.eps = kLoraNormEps;
  n.weight = L.kv_a_norm;
  rms_norm(n);
  RopeParams rope;
  rope.n_tokens = S;
  rope.inv_freq = model_.rope_inv_freq().data();
  rope.rot_dim = dr;
  rope.style = model_.rope_style();
  rope.attention_factor = c.rope_attention_factor;
  for (int64_t b = 0; b < B; ++b) {
    rope.pos0 = st.row_pos(b);
    rope.x = q + b * S * qd + dn;  // the rotated part of each head: dims [d_kn, d_kn + d_r)
    rope.n_heads = H;
    rope.head_dim = dqk;
    rope.ld_token = qd;
    rope_apply(rope);
    rope.x = ckv + b * S * ckd + dc;  // k_rot: one head
    rope.n_heads = 1;
    rope.head_dim = dr;
    rope.ld_token = ckd;
    rope_apply(rope);
  }
  // The cache's two one-head slots: K <- latent [B, 1, S, d_c], V <- k_rot [B, 1, S, d_r].
  const TensorView lat_view(ckv, DType::kF32, {B, 1, S, dc}, {S * ckd, S * ckd, ckd, 1});
  const TensorView rot_view(ckv + dc, DType::kF32, {B, 1, S, dr}, {S * ckd, S * ckd, ckd, 1});
  const KVSpan span = update_or_share(st, l, lat_view, rot_view);
  if (span.kind == KVSpanKind::kQuantized) {
    throw Error(ErrorKind::kUnsupported, "layer " + std::to_string(l) +
                                             ": MLA expands the cached latent from a dense or paged span; this cache "
                                             "returned a quantized one (use --cache dynamic, static or paged)");
  }
  const bool paged = span.kind == KVSpanKind::kPaged;
  if (st.rows_differ && !paged) {
    throw Error(ErrorKind::kInvalidArgument,
                "forward: batch rows at different positions need a paged cache (--cache paged)");
  }
  // Row j of batch row b's visible latent / rope key: a dense span's row, or a slot of a page
  // found through the CSR table (same values, so paged equals dense bit for bit: the expansion
  // and the kernel below see identical inputs).
  const auto latent_row = [&](int64_t b, int64_t j) -> const void* {
    if (!paged) return span.k.ptr(b, 0, j);
    const PagedKV& pk = span.paged;
    return pk.k_pages.ptr(pk.indices[pk.indptr[b] + j / pk.page_size], 0, j % pk.page_size);
  };
  const auto rope_row = [&](int64_t b, int64_t j) -> const void* {
    if (!paged) return span.v.ptr(b, 0, j);
    const PagedKV& pk = span.paged;
    return pk.v_pages.ptr(pk.indices[pk.indptr[b] + j / pk.page_size], 0, j % pk.page_size);
  };
  const DType kv_dtype = paged ? span.paged.k_pages.dtype() : span.k.dtype();
  int64_t max_skv = 0;
  for (int64_t b = 0; b < B; ++b) max_skv = std::max(max_skv, paged ? span.paged.seq_len(b) : span.k.dim(2));

  // Expansion after update, per batch row: kv_b(latent) -> k_nope | v per head; k_rot shared.
  float* lat32 = grow(lat32_, max_skv * dc);
  float* kvb = grow(kvb_, max_skv * H * kvbd);
  float* kfull = grow(kfull_, max_skv * qd);
  AttentionOptions opts;
  opts.scale = c.query_scale > 0 ? c.query_scale : 1.0f / std::sqrt(static_cast<float>(dqk));
  opts.causal = true;
  opts.kv_offset = span.kv_offset;
  for (int64_t b = 0; b < B; ++b) {
    // A paged span maps position p to slot p (kv_offset 0) and each row has its own length.
    const int64_t Skv = paged ? span.paged.seq_len(b) : span.k.dim(2);
    opts.q_offset = st.row_pos(b);
    for (int64_t j = 0; j < Skv; ++j) {
      convert_n(latent_row(b, j), kv_dtype, lat32 + j * dc, DType::kF32, static_cast<size_t>(dc));
    }
    linear(lat32, Skv, L.wkv_b, nullptr, kvb);  // [S_kv, H * (d_kn + d_v)]
    for (int64_t j = 0; j < Skv; ++j) {
      float* kj = kfull + j * qd;
      for (int64_t h = 0; h < H; ++h) {
        std::memcpy(kj + h * dqk, kvb + j * H * kvbd + h * kvbd, static_cast<size_t>(dn) * sizeof(float));
      }
      convert_n(rope_row(b, j), kv_dtype, kj + dn, DType::kF32, static_cast<size_t>(dr));
      for (int64_t h = 1; h < H; ++h) {
        std::memcpy(kj + h * dqk + dn, kj + dn, static_cast<size_t>(dr) * sizeof(float));
      }
    }
    const TensorView q_view(q + b * S * qd, DType::kF32, {1, H, S, dqk}, {S * qd, dqk, qd, 1});
    const TensorView k_view(kfull, DType::kF32, {1, H, Skv, dqk}, {Skv * qd, dqk, qd, 1});
    const TensorView v_view(kvb + dn, DType::kF32, {1, H, Skv, dv}, {Skv * H * kvbd, kvbd, H * kvbd, 1});
    const TensorView out_view(att + b * S * H * dv, DType::kF32, {1, H, S, dv}, {S * H * dv, dv, H * dv, 1});
    opts.workspace = attention_ws_.reserve_for(q_view, k_view, v_view, opts);
    attention_(q_view, k_view, v_view, out_view, opts);
  }
  linear(att, R, L.wo, nullptr, xb);
}

void LlamaForward::ffn_dense(const Step&, const LlamaModel::Layer& L, const TensorView& gate, const TensorView& up,
                             const TensorView& down, int64_t rows, const float* in, float* out) {
  const int64_t hidden = gate.dim(0);
  float* hb = hb_.data_as<float>();
  float* hb2 = hb2_.data_as<float>();
  // gate and up read the same input: one pass over the thread pool for both (decode).
  const MatmulParams gate_up[] = {linear_params(in, rows, gate, nullptr, hb), linear_params(in, rows, up, nullptr, hb2)};
  matmul_group(gate_up);
  if (L.sparsity_z > 0.0f && gate.data() == L.w_gate.data()) {
    // Gemma3nTextMLP._gaussian_topk: relu(gate - (mean + std * z)), std without Bessel's
    // correction, per row.
    for (int64_t r = 0; r < rows; ++r) {
      float* g = hb + r * hidden;
      float mean = 0.0f;
      for (int64_t i = 0; i < hidden; ++i) mean += g[i];
      mean /= static_cast<float>(hidden);
      float var = 0.0f;
      for (int64_t i = 0; i < hidden; ++i) var += (g[i] - mean) * (g[i] - mean);
      const float cutoff = mean + std::sqrt(var / static_cast<float>(hidden)) * L.sparsity_z;
      for (int64_t i = 0; i < hidden; ++i) g[i] = std::max(g[i] - cutoff, 0.0f);
    }
  }
  const bool gelu = model_.config().ffn_act == FfnActivation::kGeluTanh;
  auto act = [&](int64_t r0, int64_t r1) {
    float* g = hb + r0 * hidden;
    const float* u = hb2 + r0 * hidden;
    if (gelu) {
      geglu_tanh(g, u, g, (r1 - r0) * hidden);
    } else {
      swiglu(g, u, g, (r1 - r0) * hidden);
    }
  };
  if (rows >= 16) {
    // Prefill: ~1M exp/tanh per layer at 512 tokens, worth splitting; bit-identical per element.
    default_pool().parallel_for((rows + 7) / 8, [&](int64_t t) { act(t * 8, std::min(rows, t * 8 + 8)); });
  } else {
    act(0, rows);
  }
  linear(hb, rows, down, nullptr, out);
}

void LlamaForward::ffn_moe(const Step& st, const LlamaModel::Layer& L, int64_t rows) {
  const ModelConfig& c = model_.config();
  const MoeConfig& m = c.moe;
  const int64_t dim = c.dim, E = m.n_experts, K = m.n_experts_used, I = m.expert_hidden_dim;
  float* xb = xb_.data_as<float>();
  float* acc = att_.data_as<float>();  // [R, dim] routed output (att_ is free: attention is done)
  float* scratch = moe_scratch_.data_as<float>();
  float* logits = scratch;            // [E]
  float* eout = scratch + 2 * E;      // [dim]
  float* gu = eout + dim;             // [2I]
  float* row = gu + 2 * I;            // [max(dim, 2I)]
  // Routing bookkeeping, sized once per forward call (not per token).
  std::vector<int64_t> idx(static_cast<size_t>(E)), gi(static_cast<size_t>(m.n_group));
  std::vector<float> choice(static_cast<size_t>(E)), scores(static_cast<size_t>(E)), gscore(static_cast<size_t>(m.n_group));
  std::vector<char> keep(static_cast<size_t>(m.n_group));
  std::vector<std::pair<int64_t, float>> picked(static_cast<size_t>(K));
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = xb + r * dim;
    float* out = acc + r * dim;
    std::fill(out, out + dim, 0.0f);
    linear(xr, 1, L.router, L.router_bias, logits);
    // Top-k by a choice score, ties to the lower expert id.
    auto top_k = [&](const float* by, int64_t k) {
      std::iota(idx.begin(), idx.end(), 0);
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int64_t a, int64_t b) {
        return by[a] > by[b] || (by[a] == by[b] && a < b);
      });
    };
    if (m.router == MoeRouter::kGptOss) {
      // GptOssTopKRouter: topk of the logits, softmax over the k values.
      top_k(logits, K);
      const float mx = logits[idx[0]];
      float den = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        picked[static_cast<size_t>(i)] = {idx[static_cast<size_t>(i)], std::exp(logits[idx[static_cast<size_t>(i)]] - mx)};
        den += picked[static_cast<size_t>(i)].second;
      }
      for (auto& p : picked) p.second /= den;
    } else {
      if (m.router == MoeRouter::kDeepseekV3) {
        // DeepseekV3TopkRouter: sigmoid scores; the choice adds e_score_correction_bias, keeps
        // the topk_group groups with the largest sum of their top-2 choices, zeroes the rest.
        for (int64_t e = 0; e < E; ++e) {
          scores[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-logits[e]));
          choice[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] + L.score_bias[e];
        }
        const int64_t G = m.n_group, per = E / G;
        if (G > 1) {
          for (int64_t g = 0; g < G; ++g) {  // sum of the group's two best choices
            float b1 = -std::numeric_limits<float>::infinity(), b2 = b1;
            for (int64_t e = g * per; e < (g + 1) * per; ++e) {
              const float v = choice[static_cast<size_t>(e)];
              if (v > b1) {
                b2 = b1;
                b1 = v;
              } else if (v > b2) {
                b2 = v;
              }
            }
            gscore[static_cast<size_t>(g)] = b1 + (per > 1 ? b2 : 0.0f);
          }
          std::iota(gi.begin(), gi.end(), 0);
          std::partial_sort(gi.begin(), gi.begin() + m.topk_group, gi.end(), [&](int64_t a, int64_t b) {
            return gscore[static_cast<size_t>(a)] > gscore[static_cast<size_t>(b)] ||
                   (gscore[static_cast<size_t>(a)] == gscore[static_cast<size_t>(b)] && a < b);
          });
          std::fill(keep.begin(), keep.end(), 0);
          for (int64_t i = 0; i < m.topk_group; ++i) keep[static_cast<size_t>(gi[static_cast<size_t>(i)])] = true;
          for (int64_t e = 0; e < E; ++e) {
            if (!keep[static_cast<size_t>(e / per)]) choice[static_cast<size_t>(e)] = 0.0f;  // masked_fill(.., 0.0)
          }
        }
      } else {
        // DeepSeek-V2 greedy: softmax scores, chosen by themselves.
        const float mx = *std::max_element(logits, logits + E);
        float den = 0.0f;
        for (int64_t e = 0; e < E; ++e) den += scores[static_cast<size_t>(e)] = std::exp(logits[e] - mx);
        for (int64_t e = 0; e < E; ++e) choice[static_cast<size_t>(e)] = scores[static_cast<size_t>(e)] /= den;
      }
      top_k(choice.data(), K);
      float sum = 0.0f;
      for (int64_t i = 0; i < K; ++i) {
        const int64_t e = idx[static_cast<size_t>(i)];
        picked[static_cast<size_t>(i)] = {e, scores[static_cast<size_t>(e)]};
        sum += scores[static_cast<size_t>(e)];
      }
      for (auto& p : picked) {
        if (m.router == MoeRouter::kDeepseekV3) {
          // DeepseekV3TopkRouter: optional renormalisation, then always the scaling factor.
          if (m.norm_topk_prob) p.second /= (sum + 1e-20f);
          p.second *= m.routed_scaling_factor;
        } else if (K > 1 && m.norm_topk_prob) {
          // DeepSeek-V2's MoEGate: renormalised weights are NOT scaled; otherwise scaled.
          p.second /= (sum + 1e-20f);
        } else {
          p.second *= m.routed_scaling_factor;
        }
      }
    }
    for (const auto& [e, w] : picked) {
      if (m.router == MoeRouter::kGptOss) {
        const size_t gu_bytes = dtype_bytes(L.gate_up.dtype(), dim * 2 * I);
        const size_t dn_bytes = dtype_bytes(L.down.dtype(), I * dim);
        linear_in_out(xr, dim, static_cast<const std::byte*>(L.gate_up.data()) + static_cast<size_t>(e) * gu_bytes,
                      L.gate_up.dtype(), 2 * I, L.gate_up_bias + e * 2 * I, gu, row);
        swiglu_oss(gu, gu, I, m.swiglu_alpha, m.swiglu_limit);  // in place: out[i] reads [2i, 2i+1] first
        linear_in_out(gu, I, static_cast<const std::byte*>(L.down.data()) + static_cast<size_t>(e) * dn_bytes,
                      L.down.dtype(), dim, L.down_bias + e * dim, eout, row);
      } else {
        const LlamaModel::Expert& ex = L.experts[static_cast<size_t>(e)];
        ffn_dense(st, L, ex.w_gate, ex.w_up, ex.w_down, 1, xr, eout);
      }
      for (int64_t d = 0; d < dim; ++d) out[d] += w * eout[d];
    }
  }
  if (L.shared_expert) {
    // DeepseekV3MoE: routed output + shared_experts(input), the shared MLP over all rows at once.
    const GemmAsRows as_chunk(st.R);  // routed experts above keep their one-row GEMV
    ffn_dense(st, L, L.w_gate, L.w_up, L.w_down, rows, xb, xb);
    add_inplace(xb, acc, rows * dim);
  } else {
    std::memcpy(xb, acc, static_cast<size_t>(rows * dim) * sizeof(float));
  }
}

namespace {

// mean(x^2) of a row (AltUp's magnitudes).
float mean_sq(const float* x, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * x[i];
  return s / static_cast<float>(n);
}

// AltUp's rescale of a projected stream row to a target RMS: x * target / sqrt(max(mean(x^2), 1e-5)).
void rescale_row(float* x, int64_t n, float target) {
  const float mag = std::sqrt(std::max(mean_sq(x, n), 1e-5f));
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] * target / mag;
}

}  // namespace

void LlamaForward::gemma3n_layers(const Step& st, const int32_t* tokens) {
  // models/gemma3n/modeling_gemma3n.py: Gemma3nTextModel.forward, Gemma3nTextDecoderLayer,
  // Gemma3nTextAltUp, Gemma3nTextLaurelBlock, project_per_layer_inputs.
  const ModelConfig& c = model_.config();
  const Gemma3nConfig& g = c.gemma3n;
  const LlamaModel::Gemma3nWeights& W = model_.gemma3n();
  const int64_t R = st.R, dim = c.dim, A = g.altup_num_inputs, P = g.hidden_size_per_layer_input;
  const int64_t NL = c.n_layers, plane = R * dim;
  float* x = x_.data_as<float>();
  float* xb = xb_.data_as<float>();
  float* streams = streams_.data_as<float>();  // [A, R, dim]
  float* preds = preds_.data_as<float>();      // [A, R, dim]
  float* ple = ple_.data_as<float>();          // [R, L*P]
  float* g1 = g1_.data_as<float>();
  float* g2 = g2_.data_as<float>();
  auto stream = [&](float* base, int64_t i) { return base + i * plane; };
  RmsNormParams norm;
  norm.eps = c.rms_eps;

  // Per-layer inputs: norm(W_pl · e · dim^-0.5) + E_pl[token] · sqrt(P), times 2^-0.5.
  linear(x, R, W.per_layer_projection, nullptr, ple);
  const float proj_scale = static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
  for (int64_t i = 0; i < R * NL * P; ++i) ple[i] *= proj_scale;
  norm.x = norm.y = ple;
  norm.rows = R * NL;
  norm.dim = P;
  norm.weight = W.per_layer_norm;
  rms_norm(norm);
  const float pl_scale = static_cast<float>(std::sqrt(static_cast<double>(P)));
  const float input_scale = 1.0f / std::sqrt(2.0f);  // torch.rsqrt(torch.tensor(2.0))
  const size_t pl_row = dtype_bytes(W.embed_per_layer.dtype(), NL * P);
  for (int64_t r = 0; r < R; ++r) {
    // Gemma3nModel maps ids outside the per-layer vocabulary to 0.
    const int32_t t = tokens[r] < g.vocab_size_per_layer_input ? tokens[r] : 0;
    const std::byte* src = static_cast<const std::byte*>(W.embed_per_layer.data()) + static_cast<size_t>(t) * pl_row;
    for (int64_t l = 0; l < NL; ++l) {
      float* dst = ple + r * NL * P + l * P;
      dequantize_row(src + dtype_bytes(W.embed_per_layer.dtype(), l * P), W.embed_per_layer.dtype(), g2, P);
      for (int64_t i = 0; i < P; ++i) dst[i] = (dst[i] + g2[i] * pl_scale) * input_scale;
    }
  }

  // AltUp streams: copy 0 is the embedding, the others its projections rescaled to its RMS.
  std::memcpy(streams, x, static_cast<size_t>(plane) * sizeof(float));
  for (int64_t i = 1; i < A; ++i) {
    float* si = stream(streams, i);
    linear(x, R, W.altup_proj[static_cast<size_t>(i - 1)], nullptr, si);
    for (int64_t r = 0; r < R; ++r) rescale_row(si + r * dim, dim, std::sqrt(mean_sq(x + r * dim, dim)));
  }

  std::vector<float> coefs(static_cast<size_t>(A * A));  // per call, not per token
  const float router_scale = 1.0f / static_cast<float>(dim);  // hidden_size ** -1.0
  // tanh(modality_router(router_norm(v) * dim^-1)) for every row of v into out [R, A].
  auto modalities = [&](const LlamaModel::Layer& L, const float* v, float* out) {
    norm.x = v;
    norm.y = g1;
    norm.rows = R;
    norm.dim = dim;
    norm.weight = L.altup_router_norm;
    rms_norm(norm);
    for (int64_t i = 0; i < R * dim; ++i) g1[i] *= router_scale;
    linear(g1, R, L.altup_router, nullptr, out);
    for (int64_t i = 0; i < R * A; ++i) out[i] = std::tanh(out[i]);
  };
  std::vector<float> mods(static_cast<size_t>(R * A));  // per call

  for (int64_t l = 0; l < NL; ++l) {
    const LlamaModel::Layer& L = model_.layers()[static_cast<size_t>(l)];
    // predict: pred_b = s_b + sum_a C[b][a] s_a, C = prediction_coefs(modalities(s_0)) as [A, A].
    modalities(L, streams, mods.data());
    for (int64_t r = 0; r < R; ++r) {
      const float* m = mods.data() + r * A;
      for (int64_t k = 0; k < A * A; ++k) {
        float acc = 0.0f;
        for (int64_t a = 0; a < A; ++a) acc += L.altup_prediction[k * A + a] * m[a];
        coefs[static_cast<size_t>(k)] = acc;
      }
      for (int64_t b = 0; b < A; ++b) {
        float* pb = stream(preds, b) + r * dim;
        const float* sb = stream(streams, b) + r * dim;
        for (int64_t d = 0; d < dim; ++d) {
          float acc = 0.0f;
          for (int64_t a = 0; a < A; ++a) acc += stream(streams, a)[r * dim + d] * coefs[static_cast<size_t>(b * A + a)];
          pb[d] = acc + sb[d];
        }
      }
    }
    const float* active = preds;  // altup_active_idx == 0
    norm.x = active;
    norm.y = xb;
    norm.rows = R;
    norm.dim = dim;
    norm.weight = L.attn_norm;
    rms_norm(norm);
    // Laurel: normed + norm(right(left(normed))), kept in g2.
    linear(xb, R, L.laurel_left, nullptr, g1);
    linear(g1, R, L.laurel_right, nullptr, g2);
    norm.x = norm.y = g2;
    norm.weight = L.laurel_norm;
    rms_norm(norm);
    add_inplace(g2, xb, R * dim);

    attention_gqa(st, l);  // xb: normed input -> o_proj output
    norm.x = norm.y = xb;
    norm.weight = L.post_attn_norm;
    rms_norm(norm);
    const float sqrt2 = std::sqrt(2.0f);  // (attn_gated + laurel_output) / math.sqrt(2)
    for (int64_t i = 0; i < R * dim; ++i) x[i] = ((active[i] + xb[i]) + g2[i]) / sqrt2;
    norm.x = x;
    norm.y = xb;
    norm.weight = L.ffn_norm;
    rms_norm(norm);
    ffn_dense(st, L, L.w_gate, L.w_up, L.w_down, R, xb, xb);
    norm.x = norm.y = xb;
    norm.weight = L.post_ffn_norm;
    rms_norm(norm);
    add_inplace(x, xb, R * dim);  // x: the activated stream

    // correct: s_i = pred_i + (x - pred_0) * (correction_coefs(modalities(x))[i] + 1).
    modalities(L, x, mods.data());
    for (int64_t r = 0; r < R; ++r) {
      const float* m = mods.data() + r * A;
      for (int64_t i = 0; i < A; ++i) {
        float acc = 0.0f;
        for (int64_t a = 0; a < A; ++a) acc += L.altup_correction[i * A + a] * m[a];
        coefs[static_cast<size_t>(i)] = acc + 1.0f;
      }
      for (int64_t i = 0; i < A; ++i) {
        float* si = stream(streams, i) + r * dim;
        const float* pi = stream(preds, i) + r * dim;
        for (int64_t d = 0; d < dim; ++d) si[d] = (x[r * dim + d] - active[r * dim + d]) * coefs[static_cast<size_t>(i)] + pi[d];
      }
    }
    // Per-layer input: s_i += norm(proj(gelu(gate(s_0 * scale)) * ple_l)) for i >= 1.
    for (int64_t i = 0; i < R * dim; ++i) g1[i] = g.altup_correct_scale ? streams[i] * L.altup_out_scale[i % dim] : streams[i];
    linear(g1, R, L.ple_gate, nullptr, g2);  // [R, P]
    for (int64_t r = 0; r < R; ++r) geglu_tanh(g2 + r * P, ple + r * NL * P + l * P, g2 + r * P, P);
    linear(g2, R, L.ple_proj, nullptr, g1);  // [R, dim]
    norm.x = norm.y = g1;
    norm.dim = dim;
    norm.weight = L.ple_norm;
    rms_norm(norm);
    for (int64_t i = 1; i < A; ++i) add_inplace(stream(streams, i), g1, R * dim);
  }

  // Unembed: streams 1.. projected back and rescaled to stream 0's RMS, then averaged.
  for (int64_t i = 1; i < A; ++i) {
    float* pi = stream(preds, i);
    linear(stream(streams, i), R, W.altup_unembed[static_cast<size_t>(i - 1)], nullptr, pi);
    for (int64_t r = 0; r < R; ++r) rescale_row(pi + r * dim, dim, std::sqrt(mean_sq(streams + r * dim, dim)));
  }
  for (int64_t e = 0; e < R * dim; ++e) {
    float acc = streams[e];
    for (int64_t i = 1; i < A; ++i) acc += stream(preds, i)[e];
    x[e] = acc / static_cast<float>(A);
  }
}

std::span<const float> LlamaForward::forward(const ForwardParams& p) {
  struct ForwardScope {  // the thread-locals linear_params reads, for this call
    bool saved = t_batch_invariant, saved_any = t_gemm_any_rows;
    const Tensor* saved_pack = t_pack;
    ForwardScope(bool on, const Tensor& pack) {
      t_batch_invariant = on;
      t_pack = &pack;
      t_gemm_any_rows = false;
    }
    ~ForwardScope() {
      t_batch_invariant = saved;
      t_pack = saved_pack;
      t_gemm_any_rows = saved_any;
    }
  } forward_scope(p.batch_invariant, xpack_);
  const ModelConfig& c = model_.config();
  if (p.tokens == nullptr || p.batch <= 0 || p.n_tokens <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "forward: needs at least one token per batch row");
  }
  if (p.cache == nullptr && p.pos0 != 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "forward: without a cache the chunk must start at position 0 (got " +
                    std::to_string(p.pos0) + ")");
  }
  for (int64_t i = 0; i < p.batch * p.n_tokens; ++i) {
    if (p.tokens[i] < 0 || p.tokens[i] >= c.vocab_size) {
      throw Error(ErrorKind::kInvalidArgument, "token id " + std::to_string(p.tokens[i]) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(c.vocab_size) + ")");
    }
  }
  Step st{p.batch, p.n_tokens, p.batch * p.n_tokens, p.pos0, p.cache};
  if (p.row_pos0 != nullptr) {
    for (int64_t b = 0; b < p.batch; ++b) {
      if (p.row_pos0[b] < 0) throw Error(ErrorKind::kInvalidArgument, "forward: negative row position");
      st.rows_differ |= p.row_pos0[b] != p.row_pos0[0];
    }
    if (p.cache == nullptr && (st.rows_differ || p.row_pos0[0] != 0))
      throw Error(ErrorKind::kInvalidArgument, "forward: without a cache every row starts at position 0");
    st.row_pos0 = p.row_pos0;
    st.pos0 = p.row_pos0[0];  // dense paths (all rows equal) read pos0
  }
  const int64_t B = st.B, S = st.S, R = st.R, dim = c.dim;
  reserve(R);

  float* x = x_.data_as<float>();
  float* xb = xb_.data_as<float>();

  const TensorView& emb = model_.tok_embeddings();
  const size_t emb_row = dtype_bytes(emb.dtype(), dim);
  for (int64_t r = 0; r < R; ++r) {
    dequantize_row(static_cast<const std::byte*>(emb.data()) + static_cast<size_t>(p.tokens[r]) * emb_row,
                   emb.dtype(), x + r * dim, dim);
  }
  if (c.embed_scale != 1.0f) {
    // Gemma2Model: hidden_states * normalizer, normalizer = hidden_size ** 0.5 in the dtype.
    for (int64_t i = 0; i < R * dim; ++i) x[i] *= c.embed_scale;
  }

  RmsNormParams norm;
  norm.x = x;
  norm.y = xb;
  norm.rows = R;
  norm.dim = dim;
  norm.eps = c.rms_eps;
  RmsNormParams post = norm;  // Gemma-2's norms on a branch output, in place in xb
  post.x = xb;

  // The last layer only for the rows whose logits are wanted (llama.cpp's inp_out_ids): every
  // row's K/V enters the cache, no other row's output is read. A chunk that only fills the
  // cache stops after the last layer's cache update; otherwise the last row of each batch row
  // goes on as row b (GQA: from the attention on; MLA, which attends every row: from its o_proj
  // output on). The kept rows take the kernels the whole chunk would have taken
  // (MatmulParams::gemm_any_rows, and a decode row of the attention equals its prefill row), so
  // their bits do not change; a 512-token chunk of llama-125m skips ~6% of its work.
  const bool last_rows_only =
      p.logits != LogitsMode::kAll && R > B && c.n_layers > 0 && !c.gemma3n.enabled();
  for (int64_t l = 0; l < c.n_layers && !c.gemma3n.enabled(); ++l) {
    const LlamaModel::Layer& L = model_.layers()[static_cast<size_t>(l)];
    const bool last = last_rows_only && l == c.n_layers - 1;
    Step lst = st;
    if (last) lst.rows = p.logits == LogitsMode::kNone ? Step::Rows::kKvOnly : Step::Rows::kLast;
    norm.weight = L.attn_norm;
    rms_norm(norm);
    if (c.mla.enabled()) {
      attention_mla(st, l);
    } else {
      attention_gqa(lst, l);  // kLast: xb holds the B kept rows' o_proj output
    }
    if (last && p.logits == LogitsMode::kNone) break;
    const int64_t rows = last ? B : R;
    if (last) {
      keep_last_rows(x, B, S, dim);
      if (c.mla.enabled()) keep_last_rows(xb, B, S, dim);
    }
    if (L.post_attn_norm) {
      post.weight = L.post_attn_norm;
      post.rows = rows;
      rms_norm(post);
    }
    add_inplace(x, xb, rows * dim);
    norm.weight = L.ffn_norm;
    norm.rows = rows;
    rms_norm(norm);
    if (L.moe) {
      ffn_moe(st, L, rows);
    } else {
      const GemmAsRows as_chunk(R);
      ffn_dense(st, L, L.w_gate, L.w_up, L.w_down, rows, xb, xb);
    }
    if (L.post_ffn_norm) {
      post.weight = L.post_ffn_norm;
      post.rows = rows;
      rms_norm(post);
    }
    add_inplace(x, xb, rows * dim);
  }

  if (c.gemma3n.enabled()) gemma3n_layers(st, p.tokens);  // leaves the merged streams in x_

  if (p.logits == LogitsMode::kNone) return {};
  // Final norm on the rows whose logits are wanted, gathered into xb.
  int64_t out_rows = R;
  if (p.logits == LogitsMode::kLast) {
    out_rows = B;
    if (!last_rows_only) keep_last_rows(x, B, S, dim);
  }
  norm.x = x;
  norm.y = xb;
  norm.rows = out_rows;
  norm.weight = model_.output_norm();
  rms_norm(norm);
  float* logits = logits_.data_as<float>();
  linear(xb, out_rows, model_.output(), nullptr, logits);
  if (c.final_softcap > 0) softcap_inplace(logits, out_rows * c.vocab_size, c.final_softcap);
  return {logits, static_cast<size_t>(out_rows * c.vocab_size)};
}

}  // namespace kvcache
