#include "model/t5.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "kernels/kv_span_rows.h"
#include "kernels/matmul.h"
#include "model/dummy.h"
#include "model/safetensors.h"

namespace kvcache {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, path + ": cannot open");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

json parse_object(const std::string& text, const std::string& source) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw Error(ErrorKind::kFormat, source + ": not a JSON object");
  return j;
}

int64_t positive(const json& j, const char* key, std::optional<int64_t> fallback,
                 const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    throw Error(ErrorKind::kFormat, source + ": \"" + key + "\" is missing");
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() <= 0 ||
      j[key].get<int64_t>() > (int64_t{1} << 24))
    throw Error(ErrorKind::kFormat,
                source + ": \"" + key + "\" must be a positive integer, got " + j[key].dump());
  return j[key].get<int64_t>();
}

int32_t token(const json& j, const char* key, int32_t fallback, const std::string& source) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  // eos_token_id may be a list (the first is the one generation stops at).
  const json& v = j[key].is_array() && !j[key].empty() ? j[key][0] : j[key];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      v.get<int64_t>() > std::numeric_limits<int32_t>::max())
    throw Error(ErrorKind::kFormat,
                source + ": \"" + key + "\" must be a token id, got " + j[key].dump());
  return static_cast<int32_t>(v.get<int64_t>());
}

// Folder of a --model value (a folder, or a file inside it).
std::string folder_of(const std::string& spec) {
  std::error_code ec;
  if (fs::is_directory(spec, ec)) return spec;
  return fs::path(spec).parent_path().string();
}

}  // namespace

std::string T5Config::summary() const {
  return "t5: d_model " + std::to_string(d_model) + ", " + std::to_string(num_layers) +
         " encoder + " + std::to_string(num_decoder_layers) + " decoder layers, " +
         std::to_string(num_heads) + " heads x " + std::to_string(d_kv) + ", d_ff " +
         std::to_string(d_ff) + (gated ? " gated" : "") + ", vocab " + std::to_string(vocab_size) +
         (tie_word_embeddings ? ", tied head" : "");
}

T5Config parse_t5_config(const std::string& text, const std::string& source) {
  const json j = parse_object(text, source);
  T5Config c;
  c.vocab_size = positive(j, "vocab_size", std::nullopt, source);
  c.d_model = positive(j, "d_model", std::nullopt, source);
  c.d_kv = positive(j, "d_kv", std::nullopt, source);
  c.d_ff = positive(j, "d_ff", std::nullopt, source);
  c.num_heads = positive(j, "num_heads", std::nullopt, source);
  c.num_layers = positive(j, "num_layers", std::nullopt, source);
  c.num_decoder_layers = positive(j, "num_decoder_layers", c.num_layers, source);
  c.relative_attention_num_buckets = positive(j, "relative_attention_num_buckets", 32, source);
  c.relative_attention_max_distance = positive(j, "relative_attention_max_distance", 128, source);
  if (c.relative_attention_num_buckets < 4)
    throw Error(ErrorKind::kFormat,
                source +
                    ": \"relative_attention_num_buckets\" must be at least 4 (the "
                    "bidirectional buckets halve it, and half of that is exact)");
  c.max_decoder_len = positive(j, "n_positions", 512, source);
  if (j.contains("layer_norm_epsilon") && !j["layer_norm_epsilon"].is_null()) {
    if (!j["layer_norm_epsilon"].is_number() || !(j["layer_norm_epsilon"].get<double>() > 0))
      throw Error(ErrorKind::kFormat, source + ": \"layer_norm_epsilon\" must be positive");
    c.layer_norm_epsilon = j["layer_norm_epsilon"].get<float>();
  }
  // T5Config.__init__: "gated-ACT" or "ACT"; "gated-gelu" means gelu_new (the tanh
  // approximation), for backwards compatibility with the original t5 v1.1 checkpoints.
  std::string proj = "relu";
  if (j.contains("feed_forward_proj") && j["feed_forward_proj"].is_string())
    proj = j["feed_forward_proj"].get<std::string>();
  std::string act = proj;
  if (proj.starts_with("gated-")) {
    c.gated = true;
    act = proj.substr(6);
  }
  if (proj == "gated-gelu" || act == "gelu_new") {
    c.act = T5Activation::kGeluTanh;
  } else if (act == "relu") {
    c.act = T5Activation::kRelu;
  } else if (act == "gelu") {
    c.act = T5Activation::kGeluErf;
  } else {
    throw Error(ErrorKind::kUnsupported,
                source + ": feed_forward_proj \"" + proj +
                    "\" is not supported (relu, gelu, gelu_new, gated-gelu, gated-relu, "
                    "gated-gelu_new)");
  }
  if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"].is_boolean())
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  c.decoder_start_token_id = token(j, "decoder_start_token_id", 0, source);
  c.eos_token_id = token(j, "eos_token_id", 1, source);
  if (c.decoder_start_token_id >= c.vocab_size || c.eos_token_id >= c.vocab_size)
    throw Error(ErrorKind::kFormat, source +
                                        ": decoder_start_token_id / eos_token_id outside the "
                                        "vocabulary");
  return c;
}

bool config_is_encoder_decoder(const std::string& text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  if (j.contains("is_encoder_decoder") && j["is_encoder_decoder"].is_boolean() &&
      j["is_encoder_decoder"].get<bool>())
    return true;
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string t = j["model_type"].get<std::string>();
    return t == "t5" || t == "mt5" || t == "umt5" || t == "longt5";
  }
  return false;
}

bool is_encoder_decoder_model(const std::string& spec) {
  if (spec.starts_with("dummy:")) {
    const std::string name = spec.substr(6, spec.find(':', 6) - 6);
    return name.starts_with("t5-");
  }
  const std::string config = folder_of(spec) + "/config.json";
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return false;
  return config_is_encoder_decoder(read_text(config));
}

int64_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance) {
  int64_t bucket = 0;
  int64_t n = relative_position;
  if (bidirectional) {
    num_buckets /= 2;
    if (n > 0) bucket += num_buckets;
    n = n < 0 ? -n : n;
  } else {
    n = n < 0 ? -n : 0;  // -min(n, 0): keys after the query share bucket 0
  }
  const int64_t max_exact = num_buckets / 2;
  if (n < max_exact) return bucket + n;
  // torch.float32 throughout, as the module computes it; .to(long) truncates.
  const float scaled = std::log(static_cast<float>(n) / static_cast<float>(max_exact)) /
                       static_cast<float>(std::log(static_cast<double>(max_distance) /
                                                   static_cast<double>(max_exact))) *
                       static_cast<float>(num_buckets - max_exact);
  const int64_t large =
      std::min<int64_t>(max_exact + static_cast<int64_t>(scaled), num_buckets - 1);
  return bucket + large;
}

// ---------------------------------------------------------------------------------------------
// Loading

namespace {

class Loader {
 public:
  Loader(const SafetensorsFile& f, const std::string& path) : f_(f), path_(path) {}

  bool has(const std::string& name) const { return f_.tensors().count(name) != 0; }

  TensorView matrix(const std::string& name, int64_t rows, int64_t cols) const {
    auto it = f_.tensors().find(name);
    if (it == f_.tensors().end())
      throw Error(ErrorKind::kFormat, path_ + ": tensor " + name + " is missing");
    const TensorView& t = it->second;
    if (t.ndim() != 2 || t.dim(0) != rows || t.dim(1) != cols)
      throw Error(ErrorKind::kFormat, path_ + ": tensor " + name + " has shape " + t.shape().str() +
                                          ", the config wants [" + std::to_string(rows) + ", " +
                                          std::to_string(cols) + "]");
    return t;
  }

  std::vector<float> floats(const std::string& name, std::initializer_list<int64_t> shape) const {
    auto it = f_.tensors().find(name);
    if (it == f_.tensors().end())
      throw Error(ErrorKind::kFormat, path_ + ": tensor " + name + " is missing");
    const TensorView& t = it->second;
    const Shape want(shape);
    if (!(t.shape() == want))
      throw Error(ErrorKind::kFormat, path_ + ": tensor " + name + " has shape " + t.shape().str() +
                                          ", the config wants " + want.str());
    std::vector<float> out(static_cast<size_t>(t.numel()));
    convert_n(t.data(), t.dtype(), out.data(), DType::kF32, out.size());
    return out;
  }

 private:
  const SafetensorsFile& f_;
  std::string path_;
};

T5Model::Attn load_attn(const Loader& ld, const std::string& prefix, const T5Config& c) {
  T5Model::Attn a;
  a.q = ld.matrix(prefix + "q.weight", c.inner(), c.d_model);
  a.k = ld.matrix(prefix + "k.weight", c.inner(), c.d_model);
  a.v = ld.matrix(prefix + "v.weight", c.inner(), c.d_model);
  a.o = ld.matrix(prefix + "o.weight", c.d_model, c.inner());
  return a;
}

T5Model::FF load_ff(const Loader& ld, const std::string& prefix, const T5Config& c) {
  T5Model::FF f;
  if (c.gated) {
    f.wi_0 = ld.matrix(prefix + "wi_0.weight", c.d_ff, c.d_model);
    f.wi_1 = ld.matrix(prefix + "wi_1.weight", c.d_ff, c.d_model);
  } else {
    f.wi = ld.matrix(prefix + "wi.weight", c.d_ff, c.d_model);
  }
  f.wo = ld.matrix(prefix + "wo.weight", c.d_model, c.d_ff);
  return f;
}

}  // namespace

std::unique_ptr<T5Model> T5Model::load(const std::string& spec) {
  const std::string folder = folder_of(spec);
  const std::string config_path = folder + "/config.json";
  auto m = std::make_unique<T5Model>();
  m->config_ = parse_t5_config(read_text(config_path), config_path);
  const std::string path = folder + "/model.safetensors";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(ErrorKind::kIo,
                path +
                    ": not found (T5 loads one model.safetensors; sharded checkpoints are not "
                    "supported for encoder-decoder models)");
  m->file_ = SafetensorsFile::open(path);
  const Loader ld(*m->file_, path);
  const T5Config& c = m->config_;
  const int64_t nb = c.relative_attention_num_buckets;
  // shared.weight is the embedding; checkpoints saved with tied copies may carry only
  // encoder.embed_tokens.weight.
  m->shared_ = ld.matrix(ld.has("shared.weight") ? "shared.weight" : "encoder.embed_tokens.weight",
                         c.vocab_size, c.d_model);
  m->lm_head_ =
      c.tie_word_embeddings ? m->shared_ : ld.matrix("lm_head.weight", c.vocab_size, c.d_model);
  m->encoder_bias_ = ld.floats(
      "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {nb, c.num_heads});
  m->decoder_bias_ = ld.floats(
      "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", {nb, c.num_heads});
  m->encoder_final_ = ld.floats("encoder.final_layer_norm.weight", {c.d_model});
  m->decoder_final_ = ld.floats("decoder.final_layer_norm.weight", {c.d_model});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "encoder.block." + std::to_string(l) + ".layer.";
    EncoderLayer& e = m->encoder_.emplace_back();
    e.ln_self = ld.floats(p + "0.layer_norm.weight", {c.d_model});
    e.self = load_attn(ld, p + "0.SelfAttention.", c);
    e.ln_ff = ld.floats(p + "1.layer_norm.weight", {c.d_model});
    e.ff = load_ff(ld, p + "1.DenseReluDense.", c);
  }
  for (int64_t l = 0; l < c.num_decoder_layers; ++l) {
    const std::string p = "decoder.block." + std::to_string(l) + ".layer.";
    DecoderLayer& d = m->decoder_.emplace_back();
    d.ln_self = ld.floats(p + "0.layer_norm.weight", {c.d_model});
    d.self = load_attn(ld, p + "0.SelfAttention.", c);
    d.ln_cross = ld.floats(p + "1.layer_norm.weight", {c.d_model});
    d.cross = load_attn(ld, p + "1.EncDecAttention.", c);
    d.ln_ff = ld.floats(p + "2.layer_norm.weight", {c.d_model});
    d.ff = load_ff(ld, p + "2.DenseReluDense.", c);
  }
  return m;
}

size_t T5Model::weight_bytes() const {
  size_t n = 0;
  for (const auto& [name, t] : file_->tensors()) n += dtype_bytes(t.dtype(), t.numel());
  return n;
}

CacheConfig t5_cache_config(const T5Config& config, CacheOptions options) {
  CacheConfig cc;
  cc.options = std::move(options);
  cc.layer_types.assign(static_cast<size_t>(config.num_decoder_layers), "full_attention");
  return cc;
}

// ---------------------------------------------------------------------------------------------
// Forward

namespace {

// T5LayerNorm: x * rsqrt(mean(x^2) + eps) * w (no mean subtraction, no bias).
void t5_norm(const float* x, float* y, int64_t rows, int64_t dim, float eps, const float* w) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    float ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t i = 0; i < dim; ++i) yr[i] = w[i] * (xr[i] * inv);
  }
}

float activate(T5Activation a, float x) {
  switch (a) {
    case T5Activation::kRelu:
      return x > 0 ? x : 0.0f;
    case T5Activation::kGeluTanh:  // NewGELUActivation
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case T5Activation::kGeluErf:
      return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
  }
  return x;
}

// [R = B*S, H*D] rows -> a contiguous [B, H, S, D] tensor (what a cache update takes).
Tensor to_heads(const float* rows, int64_t B, int64_t S, int64_t H, int64_t D) {
  Tensor t = Tensor::empty(DType::kF32, {B, H, S, D});
  float* out = t.data_as<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s)
        std::copy_n(rows + ((b * S + s) * H + h) * D, D, out + ((b * H + h) * S + s) * D);
  return t;
}

// The bias each (head, key - query) pair adds to a score: rel in [rel_min, rel_max].
struct RelBias {
  std::vector<float> table;  // [(rel - rel_min) * H + h]
  int64_t rel_min = 0;
  int64_t H = 0;
  float at(int64_t rel, int64_t h) const {
    return table[static_cast<size_t>((rel - rel_min) * H + h)];
  }
};

RelBias make_bias(const std::vector<float>& weights, const T5Config& c, bool bidirectional,
                  int64_t rel_min, int64_t rel_max) {
  RelBias r;
  r.rel_min = rel_min;
  r.H = c.num_heads;
  r.table.resize(static_cast<size_t>((rel_max - rel_min + 1) * c.num_heads));
  for (int64_t rel = rel_min; rel <= rel_max; ++rel) {
    const int64_t bucket = t5_relative_position_bucket(
        rel, bidirectional, c.relative_attention_num_buckets, c.relative_attention_max_distance);
    for (int64_t h = 0; h < c.num_heads; ++h)
      r.table[static_cast<size_t>((rel - rel_min) * c.num_heads + h)] =
          weights[static_cast<size_t>(bucket * c.num_heads + h)];
  }
  return r;
}

}  // namespace

namespace {

// Attention of q rows [B*S, H*D] over the span's keys, written to out [B*S, H*D]. Query s of
// row b sits at position pos0 + s; key j at position j. bias: nullable (cross-attention has
// none); causal: keys after the query are masked. No 1/sqrt(D) scaling (T5).
void t5_attend(const float* q, float* out, int64_t B, int64_t S, const T5Config& c,
               const KVSpan& span, int64_t pos0, const RelBias* bias, bool causal,
               std::vector<float>& kbuf, std::vector<float>& vbuf, std::vector<float>& scores) {
  const int64_t H = c.num_heads, D = c.d_kv, inner = c.inner();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = kv_span_length(span, b);
    kbuf.resize(static_cast<size_t>(n * D));
    vbuf.resize(static_cast<size_t>(n * D));
    scores.resize(static_cast<size_t>(n));
    for (int64_t h = 0; h < H; ++h) {
      read_kv_rows(span, KVPart::kK, b, h, n, kbuf.data(), D);
      read_kv_rows(span, KVPart::kV, b, h, n, vbuf.data(), D);
      for (int64_t s = 0; s < S; ++s) {
        const int64_t i = pos0 + s;
        const float* qr = q + (b * S + s) * inner + h * D;
        const int64_t visible = causal ? std::min(n, i + 1) : n;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          float d = 0;
          const float* kr = kbuf.data() + j * D;
          for (int64_t e = 0; e < D; ++e) d += qr[e] * kr[e];
          if (bias != nullptr) d += bias->at(j - i, h);
          scores[static_cast<size_t>(j)] = d;
          mx = std::max(mx, d);
        }
        float sum = 0;
        for (int64_t j = 0; j < visible; ++j) {
          scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - mx);
          sum += scores[static_cast<size_t>(j)];
        }
        float* o = out + (b * S + s) * inner + h * D;
        std::fill_n(o, D, 0.0f);
        for (int64_t j = 0; j < visible; ++j) {
          const float p = scores[static_cast<size_t>(j)] / sum;
          const float* vr = vbuf.data() + j * D;
          for (int64_t e = 0; e < D; ++e) o[e] += p * vr[e];
        }
      }
    }
  }
}

KVSpan dense_span(const Tensor& k, const Tensor& v) {
  KVSpan s;
  s.k = k.view();
  s.v = v.view();
  return s;
}

}  // namespace

void T5Runner::encode(const int32_t* ids, int64_t B, int64_t S, EncoderDecoderCache& cache) {
  const T5Config& c = model_.config();
  if (ids == nullptr || B <= 0 || S <= 0)
    throw Error(ErrorKind::kInvalidArgument, "t5 encode: needs at least one input id per row");
  for (int64_t i = 0; i < B * S; ++i)
    if (ids[i] < 0 || ids[i] >= c.vocab_size)
      throw Error(ErrorKind::kInvalidArgument, "encoder input id " + std::to_string(ids[i]) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(c.vocab_size) + ")");
  if (cache.num_layers() != c.num_decoder_layers)
    throw Error(ErrorKind::kInvalidArgument,
                "t5 encode: the cache has " + std::to_string(cache.num_layers()) +
                    " layers for a decoder of " + std::to_string(c.num_decoder_layers));
  for (int l = 0; l < cache.num_layers(); ++l)
    if (cache.is_updated(l))
      throw Error(ErrorKind::kInvalidArgument,
                  "t5 encode: the cache already holds an encoder output (layer " +
                      std::to_string(l) + "); reset() it before encoding another input");
  const int64_t R = B * S, d = c.d_model, inner = c.inner();
  x_.resize(static_cast<size_t>(R * d));
  xb_.resize(x_.size());
  for (int64_t r = 0; r < R; ++r)
    dequantize_row(model_.shared().ptr(ids[r]), model_.shared().dtype(), x_.data() + r * d, d);
  const RelBias bias = make_bias(model_.encoder_bias(), c, /*bidirectional=*/true, -(S - 1), S - 1);
  q_.resize(static_cast<size_t>(R * inner));
  k_.resize(q_.size());
  v_.resize(q_.size());
  att_.resize(q_.size());
  h0_.resize(static_cast<size_t>(R * c.d_ff));
  h1_.resize(h0_.size());
  for (const T5Model::EncoderLayer& L : model_.encoder()) {
    t5_norm(x_.data(), xb_.data(), R, d, c.layer_norm_epsilon, L.ln_self.data());
    linear(lin_, xb_.data(), R, L.self.q, nullptr, q_.data());
    linear(lin_, xb_.data(), R, L.self.k, nullptr, k_.data());
    linear(lin_, xb_.data(), R, L.self.v, nullptr, v_.data());
    const Tensor kt = to_heads(k_.data(), B, S, c.num_heads, c.d_kv);
    const Tensor vt = to_heads(v_.data(), B, S, c.num_heads, c.d_kv);
    t5_attend(q_.data(), att_.data(), B, S, c, dense_span(kt, vt), 0, &bias, false, kbuf_, vbuf_,
              scores_);
    linear(lin_, att_.data(), R, L.self.o, nullptr, xb_.data());
    add_rows(x_.data(), xb_.data(), R * d);
    feed_forward(L.ff, L.ln_ff.data(), R);
  }
  enc_out_.resize(x_.size());
  t5_norm(x_.data(), enc_out_.data(), R, d, c.layer_norm_epsilon,
          model_.encoder_final_norm().data());
  // Every decoder layer's cross K/V, once per encoder input (v5: is_updated[layer] = True).
  for (size_t l = 0; l < model_.decoder().size(); ++l) {
    const T5Model::Attn& a = model_.decoder()[l].cross;
    linear(lin_, enc_out_.data(), R, a.k, nullptr, k_.data());
    linear(lin_, enc_out_.data(), R, a.v, nullptr, v_.data());
    const Tensor kt = to_heads(k_.data(), B, S, c.num_heads, c.d_kv);
    const Tensor vt = to_heads(v_.data(), B, S, c.num_heads, c.d_kv);
    cache.set_cross(static_cast<int>(l), kt.view(), vt.view());
  }
}

void T5Runner::add_rows(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void T5Runner::feed_forward(const T5Model::FF& ff, const float* ln, int64_t R) {
  const T5Config& c = model_.config();
  const int64_t d = c.d_model;
  h0_.resize(static_cast<size_t>(R * c.d_ff));
  h1_.resize(h0_.size());
  t5_norm(x_.data(), xb_.data(), R, d, c.layer_norm_epsilon, ln);
  if (c.gated) {
    // T5DenseGatedActDense: wo(act(wi_0 x) * wi_1 x).
    linear(lin_, xb_.data(), R, ff.wi_0, nullptr, h0_.data());
    linear(lin_, xb_.data(), R, ff.wi_1, nullptr, h1_.data());
    for (size_t i = 0; i < h0_.size(); ++i) h0_[i] = activate(c.act, h0_[i]) * h1_[i];
  } else {
    // T5DenseActDense: wo(act(wi x)).
    linear(lin_, xb_.data(), R, ff.wi, nullptr, h0_.data());
    for (float& h : h0_) h = activate(c.act, h);
  }
  linear(lin_, h0_.data(), R, ff.wo, nullptr, xb_.data());
  add_rows(x_.data(), xb_.data(), R * d);
}

std::span<const float> T5Runner::decode(const int32_t* tokens, int64_t B, int64_t S, int64_t pos0,
                                        EncoderDecoderCache& cache, bool all_logits) {
  const T5Config& c = model_.config();
  if (tokens == nullptr || B <= 0 || S <= 0 || pos0 < 0)
    throw Error(ErrorKind::kInvalidArgument, "t5 decode: needs at least one token per row");
  for (int64_t i = 0; i < B * S; ++i)
    if (tokens[i] < 0 || tokens[i] >= c.vocab_size)
      throw Error(ErrorKind::kInvalidArgument, "decoder token id " + std::to_string(tokens[i]) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(c.vocab_size) + ")");
  if (cache.num_layers() != c.num_decoder_layers)
    throw Error(ErrorKind::kInvalidArgument,
                "t5 decode: the cache has " + std::to_string(cache.num_layers()) +
                    " layers for a decoder of " + std::to_string(c.num_decoder_layers));
  for (int l = 0; l < cache.num_layers(); ++l)
    if (!cache.is_updated(l))
      throw Error(ErrorKind::kInvalidArgument,
                  "t5 decode: layer " + std::to_string(l) +
                      " has no encoder keys; run encode() on the encoder input first");
  if (cache.seq_length() != pos0)
    throw Error(ErrorKind::kInvalidArgument,
                "t5 decode: the self-attention cache holds " + std::to_string(cache.seq_length()) +
                    " tokens, the chunk starts at position " + std::to_string(pos0));
  const int64_t R = B * S, d = c.d_model, inner = c.inner();
  x_.resize(static_cast<size_t>(R * d));
  xb_.resize(x_.size());
  q_.resize(static_cast<size_t>(R * inner));
  k_.resize(q_.size());
  v_.resize(q_.size());
  att_.resize(q_.size());
  for (int64_t r = 0; r < R; ++r)
    dequantize_row(model_.shared().ptr(tokens[r]), model_.shared().dtype(), x_.data() + r * d, d);
  // Unidirectional buckets: keys at or before the query (rel <= 0); the causal mask hides the
  // others.
  const RelBias bias =
      make_bias(model_.decoder_bias(), c, /*bidirectional=*/false, -(pos0 + S - 1), 0);
  Cache& self = cache.self_attention_cache();
  for (size_t l = 0; l < model_.decoder().size(); ++l) {
    const T5Model::DecoderLayer& L = model_.decoder()[l];
    const int layer = static_cast<int>(l);
    // Self-attention through the cache.
    t5_norm(x_.data(), xb_.data(), R, d, c.layer_norm_epsilon, L.ln_self.data());
    linear(lin_, xb_.data(), R, L.self.q, nullptr, q_.data());
    linear(lin_, xb_.data(), R, L.self.k, nullptr, k_.data());
    linear(lin_, xb_.data(), R, L.self.v, nullptr, v_.data());
    const Tensor kt = to_heads(k_.data(), B, S, c.num_heads, c.d_kv);
    const Tensor vt = to_heads(v_.data(), B, S, c.num_heads, c.d_kv);
    const KVSpan span = self.update(layer, kt.view(), vt.view());
    if (span.kind == KVSpanKind::kDense && span.kv_offset != 0)
      throw Error(ErrorKind::kUnsupported,
                  "t5 decode: layer " + std::to_string(l) +
                      ": the self-attention cache dropped the first " +
                      std::to_string(span.kv_offset) +
                      " tokens; T5's decoder attends to every earlier token (use a full-attention "
                      "cache)");
    for (int64_t b = 0; b < B; ++b)
      if (kv_span_length(span, b) != pos0 + S)
        KV_CHECK(false, "t5 decode: layer " + std::to_string(l) + " returned " +
                            std::to_string(kv_span_length(span, b)) + " keys for " +
                            std::to_string(pos0 + S) + " positions");
    t5_attend(q_.data(), att_.data(), B, S, c, span, pos0, &bias, true, kbuf_, vbuf_, scores_);
    linear(lin_, att_.data(), R, L.self.o, nullptr, xb_.data());
    add_rows(x_.data(), xb_.data(), R * d);
    // Cross-attention over the encoder output's K/V (no position bias: the module has no
    // relative_attention_bias and the encoder has no padding here).
    t5_norm(x_.data(), xb_.data(), R, d, c.layer_norm_epsilon, L.ln_cross.data());
    linear(lin_, xb_.data(), R, L.cross.q, nullptr, q_.data());
    t5_attend(q_.data(), att_.data(), B, S, c, cache.cross(layer), pos0, nullptr, false, kbuf_,
              vbuf_, scores_);
    linear(lin_, att_.data(), R, L.cross.o, nullptr, xb_.data());
    add_rows(x_.data(), xb_.data(), R * d);
    feed_forward(L.ff, L.ln_ff.data(), R);
  }
  // Final norm on the rows whose logits are wanted, then (tied) the d_model^-0.5 rescale.
  const int64_t out_rows = all_logits ? R : B;
  for (int64_t b = 0; b < B && !all_logits; ++b)
    std::copy_n(x_.data() + (b * S + S - 1) * d, d, xb_.data() + b * d);
  const float* src = all_logits ? x_.data() : xb_.data();
  std::vector<float>& normed = att_;  // free again after the last layer
  normed.resize(static_cast<size_t>(std::max(R * inner, out_rows * d)));
  t5_norm(src, normed.data(), out_rows, d, c.layer_norm_epsilon,
          model_.decoder_final_norm().data());
  if (c.tie_word_embeddings) {
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    for (int64_t i = 0; i < out_rows * d; ++i) normed[static_cast<size_t>(i)] *= scale;
  }
  logits_.resize(static_cast<size_t>(out_rows * c.vocab_size));
  linear(lin_, normed.data(), out_rows, model_.lm_head(), nullptr, logits_.data());
  return {logits_.data(), logits_.size()};
}

// ---------------------------------------------------------------------------------------------
// Dummy presets

namespace {

const char* t5_preset_json(const std::string& name) {
  // Small buckets and max distance so that the log-spaced buckets are reached at test lengths.
  if (name == "t5-tiny")
    return R"({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
  "is_encoder_decoder": true, "vocab_size": 96, "d_model": 32, "d_kv": 8, "d_ff": 64,
  "num_heads": 4, "num_layers": 2, "num_decoder_layers": 2,
  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
  "layer_norm_epsilon": 1e-6, "feed_forward_proj": "relu", "tie_word_embeddings": true,
  "decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0, "n_positions": 128})";
  if (name == "t5-tiny-gated")
    return R"({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5",
  "is_encoder_decoder": true, "vocab_size": 96, "d_model": 32, "d_kv": 8, "d_ff": 48,
  "num_heads": 4, "num_layers": 2, "num_decoder_layers": 3,
  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 16,
  "layer_norm_epsilon": 1e-6, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": false,
  "decoder_start_token_id": 0, "eos_token_id": 1, "pad_token_id": 0, "n_positions": 128})";
  return nullptr;
}

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform values of mean `mean` and standard deviation `stddev`, seeded per tensor.
Tensor random_f32(const Shape& shape, uint64_t seed, float mean, float stddev) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  float* p = t.data_as<float>();
  const float a = stddev * std::sqrt(3.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t x = mix64(seed + static_cast<uint64_t>(i));
    p[i] = mean + (static_cast<float>(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * a;
  }
  return t;
}

}  // namespace

std::vector<std::string> dummy_t5_preset_names() {
  return {"t5-tiny", "t5-tiny-gated"};
}

std::string dummy_t5_config_json(const std::string& preset) {
  const char* j = t5_preset_json(preset);
  if (j == nullptr)
    throw Error(ErrorKind::kInvalidArgument,
                "unknown T5 dummy preset '" + preset + "' (known: t5-tiny, t5-tiny-gated)");
  return j;
}

std::string build_dummy_t5(const std::string& preset, uint64_t seed, const std::string& cache_dir) {
  const std::string config_text = dummy_t5_config_json(preset);
  const T5Config c = parse_t5_config(config_text, "dummy:" + preset);
  const std::string dir = (cache_dir.empty() ? default_model_cache_dir() : cache_dir) + "/dummy-" +
                          preset + "-s" + std::to_string(seed);
  std::error_code ec;
  if (fs::is_regular_file(dir + "/model.safetensors", ec) &&
      fs::is_regular_file(dir + "/config.json", ec) &&
      read_text(dir + "/config.json") == config_text)
    return dir;
  // Written into a private folder, then renamed: a concurrent reader never sees half a model.
  const std::string tmp = dir + ".tmp" + std::to_string(::getpid());
  fs::create_directories(tmp);
  std::vector<std::pair<std::string, Tensor>> owned;
  uint64_t tag = mix64(seed ^ 0x75u);
  auto add = [&](const std::string& name, const Shape& shape, float mean, float stddev) {
    tag = mix64(tag);
    owned.emplace_back(name, random_f32(shape, tag, mean, stddev));
  };
  const int64_t d = c.d_model, in = c.inner(), ff = c.d_ff, nb = c.relative_attention_num_buckets;
  const float sd = 1.0f / std::sqrt(static_cast<float>(d));
  add("shared.weight", {c.vocab_size, d}, 0.0f, 1.0f);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, d}, 0.0f, sd);
  auto attn = [&](const std::string& p) {
    add(p + "q.weight", {in, d}, 0.0f, sd);
    add(p + "k.weight", {in, d}, 0.0f, sd);
    add(p + "v.weight", {in, d}, 0.0f, sd);
    add(p + "o.weight", {d, in}, 0.0f, 1.0f / std::sqrt(static_cast<float>(in)));
  };
  auto feed = [&](const std::string& p) {
    if (c.gated) {
      add(p + "wi_0.weight", {ff, d}, 0.0f, sd);
      add(p + "wi_1.weight", {ff, d}, 0.0f, sd);
    } else {
      add(p + "wi.weight", {ff, d}, 0.0f, sd);
    }
    add(p + "wo.weight", {d, ff}, 0.0f, 1.0f / std::sqrt(static_cast<float>(ff)));
  };
  for (const char* stack : {"encoder", "decoder"}) {
    const bool dec = std::string(stack) == "decoder";
    const int64_t n = dec ? c.num_decoder_layers : c.num_layers;
    for (int64_t l = 0; l < n; ++l) {
      const std::string p = std::string(stack) + ".block." + std::to_string(l) + ".layer.";
      add(p + "0.layer_norm.weight", {d}, 1.0f, 0.1f);
      attn(p + "0.SelfAttention.");
      // A strong bias so that the buckets change the logits.
      if (l == 0)
        add(p + "0.SelfAttention.relative_attention_bias.weight", {nb, c.num_heads}, 0.0f, 1.0f);
      int idx = 1;
      if (dec) {
        add(p + "1.layer_norm.weight", {d}, 1.0f, 0.1f);
        attn(p + "1.EncDecAttention.");
        idx = 2;
      }
      add(p + std::to_string(idx) + ".layer_norm.weight", {d}, 1.0f, 0.1f);
      feed(p + std::to_string(idx) + ".DenseReluDense.");
    }
    add(std::string(stack) + ".final_layer_norm.weight", {d}, 1.0f, 0.1f);
  }
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, t] : owned) views.emplace_back(name, t.view());
  write_safetensors(tmp + "/model.safetensors", views, {{"format", "pt"}});
  {
    std::ofstream out(tmp + "/config.json", std::ios::binary);
    out << config_text;
    if (!out) throw Error(ErrorKind::kIo, tmp + "/config.json: cannot write");
  }
  fs::remove_all(dir, ec);
  fs::rename(tmp, dir, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    // Another process renamed its identical copy first.
    if (!fs::is_regular_file(dir + "/model.safetensors"))
      throw Error(ErrorKind::kIo, dir + ": cannot write the dummy T5 model");
  }
  return dir;
}

}  // namespace kvcache
