#include "model/llama.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cache/cache.h"
#include "core/error.h"
#include "kernels/activation.h"
#include "kernels/matmul.h"
#include "kernels/norm.h"

namespace kvcache {

const float* LlamaModel::as_f32(const TensorView& t) {
  if (t.dtype() == DType::kF32) return t.data_as<const float>();
  Tensor c = Tensor::empty(DType::kF32, {t.numel()});
  convert_n(t.data(), t.dtype(), c.data(), DType::kF32, static_cast<size_t>(t.numel()));
  converted_.push_back(std::move(c));
  return converted_.back().data_as<const float>();
}

LlamaModel::LlamaModel(std::unique_ptr<ModelFile> file) : file_(std::move(file)) {
  KV_CHECK(file_ != nullptr, "LlamaModel needs a model file");
  file_->validate_llama_weights();
  const ModelConfig& c = file_->config();
  tok_embeddings_ = file_->tensor("token_embd.weight");
  output_ = c.tie_word_embeddings ? tok_embeddings_ : file_->tensor("output.weight");
  output_norm_ = as_f32(file_->tensor("output_norm.weight"));
  for (const TensorView* t : {&tok_embeddings_, &output_}) {
    if (t->dtype() == DType::kQ8_0 && c.dim % 32 != 0) {
      throw Error(ErrorKind::kFormat, file_->path() + ": q8_0 matrices need dim % 32 == 0");
    }
  }
  layers_.resize(static_cast<size_t>(c.n_layers));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    Layer& L = layers_[static_cast<size_t>(l)];
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
    L.sliding = c.layer_types[static_cast<size_t>(l)] == "sliding_attention";
    for (const TensorView* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      if (t->dtype() == DType::kQ8_0 && t->dim(1) % 32 != 0) {
        throw Error(ErrorKind::kFormat, file_->path() + ": layer " + std::to_string(l) +
                                            ": q8_0 matrix with a row length not a multiple of 32");
      }
    }
  }
  inv_freq_ = ::kvcache::rope_inv_freq(c.head_dim, c.rope_theta,
                            c.rope_freq_factors.empty() ? nullptr : c.rope_freq_factors.data());
  rope_style_ = c.rope_interleaved ? RopeStyle::kInterleaved : RopeStyle::kHalf;
}

// ---------------------------------------------------------------------------------------------

LlamaForward::LlamaForward(const LlamaModel& model, std::string_view kernel, int64_t max_rows)
    : model_(model), attention_(get_attention_kernel(kernel)) {
  reserve(std::max<int64_t>(1, max_rows));
}

void LlamaForward::reserve(int64_t rows) {
  if (rows <= rows_) return;
  const ModelConfig& c = model_.config();
  const int64_t qd = c.n_heads * c.head_dim, kvd = c.n_kv_heads * c.head_dim;
  x_ = Tensor::empty(DType::kF32, {rows, c.dim});
  xb_ = Tensor::empty(DType::kF32, {rows, std::max(c.dim, qd)});
  q_ = Tensor::empty(DType::kF32, {rows, qd});
  k_ = Tensor::empty(DType::kF32, {rows, kvd});
  v_ = Tensor::empty(DType::kF32, {rows, kvd});
  att_ = Tensor::empty(DType::kF32, {rows, qd});
  hb_ = Tensor::empty(DType::kF32, {rows, c.hidden_dim});
  hb2_ = Tensor::empty(DType::kF32, {rows, c.hidden_dim});
  logits_ = Tensor::empty(DType::kF32, {rows, c.vocab_size});
  rows_ = rows;
}

size_t LlamaForward::workspace_bytes() const {
  return x_.size_bytes() + xb_.size_bytes() + q_.size_bytes() + k_.size_bytes() + v_.size_bytes() +
         att_.size_bytes() + hb_.size_bytes() + hb2_.size_bytes() + logits_.size_bytes();
}

namespace {

void linear(const float* x, int64_t rows, const TensorView& w, const float* bias, float* y) {
  MatmulParams p;
  p.x = x;
  p.ldx = w.dim(1);
  p.w = w.data();
  p.w_dtype = w.dtype();
  p.bias = bias;
  p.y = y;
  p.ldy = w.dim(0);
  p.m = rows;
  p.n = w.dim(0);
  p.k = w.dim(1);
  matmul(p);
}

void add_inplace(float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

}  // namespace

std::span<const float> LlamaForward::forward(const ForwardParams& p) {
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
  const int64_t B = p.batch, S = p.n_tokens, R = B * S;
  const int64_t dim = c.dim, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim;
  const int64_t qd = H * D, kvd = Hkv * D, hidden = c.hidden_dim;
  reserve(R);

  float* x = x_.data_as<float>();
  float* xb = xb_.data_as<float>();
  float* q = q_.data_as<float>();
  float* k = k_.data_as<float>();
  float* v = v_.data_as<float>();
  float* att = att_.data_as<float>();
  float* hb = hb_.data_as<float>();
  float* hb2 = hb2_.data_as<float>();

  const TensorView& emb = model_.tok_embeddings();
  const size_t emb_row = dtype_bytes(emb.dtype(), dim);
  for (int64_t r = 0; r < R; ++r) {
    dequantize_row(static_cast<const std::byte*>(emb.data()) + static_cast<size_t>(p.tokens[r]) * emb_row,
                   emb.dtype(), x + r * dim, dim);
  }

  // Views over the row-major [B*S, heads*D] buffers as [B, heads, S, D]: no transposes.
  const TensorView q_view(q, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});
  const TensorView k_view(k, DType::kF32, {B, Hkv, S, D}, {S * kvd, D, kvd, 1});
  const TensorView v_view(v, DType::kF32, {B, Hkv, S, D}, {S * kvd, D, kvd, 1});
  const TensorView out_view(att, DType::kF32, {B, H, S, D}, {S * qd, D, qd, 1});

  AttentionOptions opts;
  opts.scale = 1.0f / std::sqrt(static_cast<float>(D));
  opts.causal = true;
  opts.q_offset = p.pos0;

  RmsNormParams norm;
  norm.x = x;
  norm.y = xb;
  norm.rows = R;
  norm.dim = dim;
  norm.eps = c.rms_eps;

  RopeParams rope;
  rope.n_tokens = S;
  rope.head_dim = D;
  rope.pos0 = p.pos0;
  rope.inv_freq = model_.rope_inv_freq().data();
  rope.rot_dim = D;
  rope.style = model_.rope_style();

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LlamaModel::Layer& L = model_.layers()[static_cast<size_t>(l)];
    norm.weight = L.attn_norm;
    rms_norm(norm);
    linear(xb, R, L.wq, L.bq, q);
    linear(xb, R, L.wk, L.bk, k);
    linear(xb, R, L.wv, L.bv, v);
    // RoPE on the new keys only, before they enter the cache: cached keys are never re-rotated.
    for (int64_t b = 0; b < B; ++b) {
      rope.x = q + b * S * qd;
      rope.n_heads = H;
      rope_apply(rope);
      rope.x = k + b * S * kvd;
      rope.n_heads = Hkv;
      rope_apply(rope);
    }
    KVSpan span;
    if (p.cache == nullptr) {
      span.k = k_view;
      span.v = v_view;
      span.kv_offset = 0;
    } else if (p.cache->is_shared(static_cast<int>(l))) {
      span = p.cache->shared_kv(static_cast<int>(l));
    } else {
      span = p.cache->update(static_cast<int>(l), k_view, v_view);
    }
    opts.kv_offset = span.kv_offset;
    opts.sliding_window = L.sliding ? c.sliding_window : 0;
    attention_(q_view, span.k, span.v, out_view, opts);
    linear(att, R, L.wo, nullptr, xb);
    add_inplace(x, xb, R * dim);

    norm.weight = L.ffn_norm;
    rms_norm(norm);
    linear(xb, R, L.w_gate, nullptr, hb);
    linear(xb, R, L.w_up, nullptr, hb2);
    swiglu(hb, hb2, hb, R * hidden);
    linear(hb, R, L.w_down, nullptr, xb);
    add_inplace(x, xb, R * dim);
  }

  if (p.logits == LogitsMode::kNone) return {};
  // Final norm on the rows whose logits are wanted, gathered into xb.
  int64_t out_rows = R;
  if (p.logits == LogitsMode::kLast) {
    out_rows = B;
    for (int64_t b = 0; b < B; ++b) std::memcpy(x + b * dim, x + (b * S + S - 1) * dim, static_cast<size_t>(dim) * sizeof(float));
  }
  norm.x = x;
  norm.y = xb;
  norm.rows = out_rows;
  norm.weight = model_.output_norm();
  rms_norm(norm);
  float* logits = logits_.data_as<float>();
  linear(xb, out_rows, model_.output(), nullptr, logits);
  return {logits, static_cast<size_t>(out_rows * c.vocab_size)};
}

}  // namespace kvcache
