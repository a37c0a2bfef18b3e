#include "model/forward.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"

namespace kvcache {

namespace {

std::vector<ScratchBuffer> forward_buffers(const ModelConfig& c) {
  const int64_t qd = c.n_heads * c.qk_head_dim(), od = c.n_heads * c.v_head_dim();
  // MoE sums its routed experts into att: [R, dim] at least.
  return {{c.dim, 0},
          {std::max({c.dim, qd, od}), 0},
          {std::max({qd, od, c.dim}), 0},
          {c.vocab_size, 0}};
}

// x and every attention input are dim wide; o_proj reads H*D_v, and no linear is wider here.
int64_t forward_widest_input(const ModelConfig& c) {
  return std::max({c.dim, c.n_heads * c.qk_head_dim(), c.n_heads * c.v_head_dim()});
}

// kv_dtype unset: the f32 of the projections, so the container holds them bit for bit.
CacheConfig recompute_config(const ModelConfig& c) {
  return model_cache_config(c, CacheOptions{.implementation = "recompute"});
}

void softcap_inplace(float* a, int64_t n, float cap) {
  // Gemma2ForCausalLM: logits / cap -> tanh -> * cap.
  for (int64_t i = 0; i < n; ++i) a[i] = std::tanh(a[i] / cap) * cap;
}

}  // namespace

CacheConfig model_cache_config(const ModelConfig& model, CacheOptions options) {
  CacheConfig cc;
  cc.options = std::move(options);
  cc.layer_types = model.layer_types;
  cc.sliding_window = model.sliding_window;
  cc.attention_chunk_size = model.attention_chunk_size;
  cc.num_kv_shared_layers = static_cast<int>(model.num_kv_shared_layers);
  if (model.mla.enabled()) cc.kv_content = CacheConfig::KVContent::kMlaLatent;
  if (const LinearAttentionConfig& a = model.linear_attn; a.enabled()) {
    cc.linear = LinearStateShape{a.conv_kernel, a.conv_dim(), a.num_value_heads, a.key_head_dim,
                                 a.value_head_dim};
  }
  if (const DeepseekV4Config& v = model.deepseek_v4; v.enabled()) {
    // DeepSeek-V4: the compressed layers' rates and the CSA indexer's key width.
    cc.compressed.rates = {{"compressed_sparse_attention", v.csa_rate},
                           {"heavily_compressed_attention", v.hca_rate}};
    cc.compressed.index_head_dim = v.index_head_dim;
  }
  return cc;
}

const ScratchKind kForwardScratch{"forward", &forward_buffers, &forward_widest_input};

Forward::Forward(const Model& model, std::string_view kernel, int64_t max_rows)
    : model_(model),
      kernel_(kernel),
      ws_(model.config(), model.scratch()),
      recompute_(std::make_unique<Cache>(recompute_config(model.config()))) {
  ws_.reserve(std::max<int64_t>(1, max_rows));
}

size_t Forward::workspace_bytes_for(const ModelConfig& config, int64_t rows) {
  return Workspace::bytes_for(config, Model::scratch_for(config), rows);
}

Step Forward::begin(const ForwardParams& p, Cache& cache) {
  const ModelConfig& c = model_.config();
  if (p.tokens == nullptr || p.batch <= 0 || p.n_tokens <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "forward: needs at least one token per batch row");
  }
  for (int64_t i = 0; i < p.batch * p.n_tokens; ++i) {
    if (p.tokens[i] < 0 || p.tokens[i] >= c.vocab_size) {
      throw Error(ErrorKind::kInvalidArgument, "token id " + std::to_string(p.tokens[i]) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(c.vocab_size) + ")");
    }
  }
  if (cache.num_layers() != c.n_layers) {
    throw Error(ErrorKind::kInvalidArgument,
                "forward: the cache has " + std::to_string(cache.num_layers()) +
                    " layers for a model of " + std::to_string(c.n_layers));
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    if (cache.source_layer(static_cast<int>(l)) != model_.kv_source(l)) {
      throw Error(ErrorKind::kInvalidArgument,
                  "layer " + std::to_string(l) + ": the cache shares KV from layer " +
                      std::to_string(cache.source_layer(static_cast<int>(l))) +
                      " but the model reads layer " + std::to_string(model_.kv_source(l)) +
                      " (build the cache with the model's num_kv_shared_layers)");
    }
  }
  Step st;
  st.B = p.batch;
  st.S = p.n_tokens;
  st.R = p.batch * p.n_tokens;
  st.pos0 = p.pos0;
  if (p.row_pos0 != nullptr) {
    for (int64_t b = 0; b < p.batch; ++b)
      if (p.row_pos0[b] < 0)
        throw Error(ErrorKind::kInvalidArgument, "forward: negative row position");
    st.row_pos0 = p.row_pos0;
    st.pos0 = p.row_pos0[0];
  }
  st.cache = &cache;
  st.kernel = &kernel_;
  st.ws = &ws_;
  ws_.reserve(st.R);
  st.linear.allow_blas = !p.batch_invariant;
  st.linear.pack = ws_.pack();
  st.linear.pack_floats = ws_.pack_floats();
  return st;
}

void Forward::embed(const Step& st, const int32_t* tokens) {
  const ModelConfig& c = model_.config();
  const int64_t dim = c.dim;
  float* x = ws_.data(kForwardScratch, kX);
  const TensorView& emb = model_.embeddings();
  const size_t emb_row = dtype_bytes(emb.dtype(), dim);
  for (int64_t r = 0; r < st.R; ++r) {
    dequantize_row(
        static_cast<const std::byte*>(emb.data()) + static_cast<size_t>(tokens[r]) * emb_row,
        emb.dtype(), x + r * dim, dim);
  }
  if (c.embed_scale != 1.0f) {
    // Gemma2Model: hidden_states * normalizer, normalizer = hidden_size ** 0.5 in the dtype.
    for (int64_t i = 0; i < st.R * dim; ++i) x[i] *= c.embed_scale;
  }
}

std::span<const float> Forward::head(const Step& st, int64_t kept, LogitsMode mode) {
  const ModelConfig& c = model_.config();
  float* x = ws_.data(kForwardScratch, kX);
  float* xb = ws_.data(kForwardScratch, kXb);
  int64_t out_rows = st.R;
  if (mode == LogitsMode::kLast) {
    out_rows = st.B;
    if (kept != st.B) keep_last_rows(x, st.B, st.S, c.dim);
  }
  norm_rows(x, xb, out_rows, c.dim, c.rms_eps, model_.output_norm());
  float* logits = ws_.data(kForwardScratch, kLogits);
  linear(st.linear, xb, out_rows, model_.output(), nullptr, logits);
  if (c.final_softcap > 0) softcap_inplace(logits, out_rows * c.vocab_size, c.final_softcap);
  return {logits, static_cast<size_t>(out_rows * c.vocab_size)};
}

std::span<const float> Forward::forward(const ForwardParams& p) {
  Step st = begin(p, p.cache != nullptr ? *p.cache : *recompute_);
  embed(st, p.tokens);
  const int64_t kept = model_.stack().run(
      st, model_.blocks(), p.tokens, p.logits != LogitsMode::kAll, p.logits == LogitsMode::kNone);
  if (p.logits == LogitsMode::kNone) return {};
  return head(st, kept, p.logits);
}

}  // namespace kvcache
