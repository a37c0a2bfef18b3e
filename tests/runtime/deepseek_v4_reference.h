// An independent no-cache forward of DeepSeek-V4 (DeepseekV4ForCausalLM, issue 39 "How it is
// checked"), in double precision, restated from transformers' models/deepseek_v4/
// modeling_deepseek_v4.py and configuration_deepseek_v4.py (each step names the class it
// restates). It shares no code with src/: the config is read from a config.json object with
// nlohmann::json (not the runtime's ModelConfig), the weights are a map from their Hugging Face
// names to doubles (the test generates them and hands the same arrays to the folder writer and
// to this forward; load_folder reads a folder with its own safetensors parser), and every step
// is a plain loop over std::vector<double>.
//
// Stateless, as transformers with past_key_values=None: every call recomputes the whole
// sequence (compress every complete window, mask the compressed entries causally), so the
// logits of position t from a length-n forward equal those of a length-(t+1) forward, and
// greedy() recomputes the prefix for each new token.
//
// Also here: the writer of a tiny DeepSeek-V4 folder (config.json + model.safetensors, random
// weights with transformers' parameter names) with its own safetensors encoder (F32, BF16, I32,
// I64: tid2eid is an integer table).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace kvcache::testing_util::dsv4 {

using Vec = std::vector<double>;
constexpr double kNegInf = -std::numeric_limits<double>::infinity();

inline size_t ix(int64_t r, int64_t c, int64_t ld) {
  return static_cast<size_t>(r * ld + c);
}

// ---------------------------------------------------------------------------------------------
// Config: DeepseekV4Config (configuration_deepseek_v4.py), the fields the forward reads, with
// the class's defaults and its __post_init__ folding of the legacy keys (compress_ratios,
// compress_rate_csa / _hca, num_hash_layers, qk_rope_head_dim).
struct Config {
  int64_t vocab_size = 129280, hidden_size = 4096, moe_intermediate_size = 2048;
  int64_t num_hidden_layers = 43, num_attention_heads = 64, head_dim = 512, q_lora_rank = 1024;
  int64_t num_experts_per_tok = 6, n_routed_experts = 256, n_shared_experts = 1;
  std::string scoring_func = "sqrtsoftplus";
  double routed_scaling_factor = 1.5, rope_theta = 10000.0, compress_rope_theta = 160000.0;
  double partial_rotary_factor = 64.0 / 512.0;
  std::vector<std::string> layer_types, mlp_layer_types;
  int64_t rate_csa = 4, rate_hca = 128;
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6, swiglu_limit = 10.0, rms_norm_eps = 1e-6;
  int64_t sliding_window = 128, o_groups = 8, o_lora_rank = 1024;
  int64_t index_n_heads = 64, index_head_dim = 128, index_topk = 512;
  bool tie_word_embeddings = false;
  int64_t max_position_embeddings = 1048576;
  // The compress rope's YaRN (rope_parameters / rope_scaling with rope_type "yarn"):
  // DeepseekV4Config.__post_init__ puts it on the compress rope only, attention_factor 1.0
  // unless given.
  bool yarn = false;
  double yarn_factor = 1.0, beta_fast = 32.0, beta_slow = 1.0, yarn_attention_factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  bool yarn_truncate = true;

  // DeepseekV4RotaryEmbedding.compute_default_rope_parameters: dim = int(head_dim * factor),
  // the same for "main" and "compress" (and for the indexer, whose rotary reads head_dim too).
  int64_t rope_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  // The [rope_dim / 2] inverse frequencies and the cos / sin scale of the two rotary embeddings
  // (DeepseekV4RotaryEmbedding: compute_default_rope_parameters, or _compute_yarn_parameters
  // of modeling_rope_utils.py on the compress rope).
  struct Rope {
    Vec inv_freq;
    double scale = 1.0;
  };
  Rope main_rope() const { return default_rope(rope_theta); }
  Rope compress_rope() const {
    Rope r = default_rope(compress_rope_theta);
    if (!yarn) return r;
    // YaRN: per pair i, between 1 / (factor * base^(2i/dim)) (interpolated) and base^-(2i/dim)
    // (extrapolated), with the ramp (i - low) / (high - low) clamped to [0, 1] over the pairs,
    // low / high from the correction dims of beta_fast / beta_slow rotations at the original
    // context (floored / ceiled when truncate), clamped to [0, dim - 1].
    const auto dim = static_cast<double>(rope_dim());
    const double base = compress_rope_theta,
                 orig = static_cast<double>(original_max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * 2.0 * std::numbers::pi)) / (2.0 * std::log(base));
    };
    double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
    if (yarn_truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, dim - 1);
    if (low == high) high += 0.001;
    for (size_t i = 0; i < r.inv_freq.size(); ++i) {
      const double extra = r.inv_freq[i], inter = extra / yarn_factor;
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      const double extra_weight = 1.0 - ramp;
      r.inv_freq[i] = inter * (1.0 - extra_weight) + extra * extra_weight;
    }
    r.scale = yarn_attention_factor;
    return r;
  }
  Rope default_rope(double theta) const {
    Rope r;
    const int64_t rd = rope_dim();
    for (int64_t i = 0; i < rd / 2; ++i)
      r.inv_freq.push_back(1.0 /
                           std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rd)));
    return r;
  }
  const std::string& type(int64_t l) const { return layer_types[static_cast<size_t>(l)]; }
  bool is_csa(int64_t l) const { return type(l) == "compressed_sparse_attention"; }
  bool is_hca(int64_t l) const { return type(l) == "heavily_compressed_attention"; }
  bool is_hash(int64_t l) const { return mlp_layer_types[static_cast<size_t>(l)] == "hash_moe"; }
  int64_t rate(int64_t l) const { return is_csa(l) ? rate_csa : is_hca(l) ? rate_hca : 0; }
};

inline Config parse_config(const nlohmann::json& j) {
  Config c;
  auto has = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  auto get_i = [&](const char* k, int64_t& v) {
    if (has(k)) v = j[k].get<int64_t>();
  };
  auto get_d = [&](const char* k, double& v) {
    if (has(k)) v = j[k].get<double>();
  };
  get_i("vocab_size", c.vocab_size);
  get_i("hidden_size", c.hidden_size);
  get_i("moe_intermediate_size", c.moe_intermediate_size);
  get_i("num_hidden_layers", c.num_hidden_layers);
  get_i("num_attention_heads", c.num_attention_heads);
  get_i("head_dim", c.head_dim);
  get_i("q_lora_rank", c.q_lora_rank);
  get_i("num_experts_per_tok", c.num_experts_per_tok);
  get_i("n_routed_experts", c.n_routed_experts);
  get_i("n_shared_experts", c.n_shared_experts);
  if (has("scoring_func")) c.scoring_func = j["scoring_func"].get<std::string>();
  get_d("routed_scaling_factor", c.routed_scaling_factor);
  get_d("rope_theta", c.rope_theta);
  get_d("compress_rope_theta", c.compress_rope_theta);
  get_i("hc_mult", c.hc_mult);
  get_i("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  get_d("hc_eps", c.hc_eps);
  get_d("swiglu_limit", c.swiglu_limit);
  get_d("rms_norm_eps", c.rms_norm_eps);
  get_i("sliding_window", c.sliding_window);
  get_i("o_groups", c.o_groups);
  get_i("o_lora_rank", c.o_lora_rank);
  get_i("index_n_heads", c.index_n_heads);
  get_i("index_head_dim", c.index_head_dim);
  get_i("index_topk", c.index_topk);
  if (has("tie_word_embeddings")) c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  if (has("hidden_act") && j["hidden_act"] != "silu")
    throw std::runtime_error("reference: only hidden_act silu is restated");
  if (c.n_shared_experts != 1)
    throw std::runtime_error("reference: DeepseekV4SparseMoeBlock has one shared expert");
  const int64_t n = c.num_hidden_layers;
  // compress_rates: dict, defaults {CSA 4, HCA 128}; legacy scalars fold in.
  if (has("compress_rates")) {
    const auto& r = j["compress_rates"];
    if (r.contains("compressed_sparse_attention"))
      c.rate_csa = r["compressed_sparse_attention"].get<int64_t>();
    if (r.contains("heavily_compressed_attention"))
      c.rate_hca = r["heavily_compressed_attention"].get<int64_t>();
  }
  get_i("compress_rate_csa", c.rate_csa);
  get_i("compress_rate_hca", c.rate_hca);
  // layer_types: explicit > legacy compress_ratios (0 / 4 / 128 per layer) > 2x HCA then
  // HCA / CSA alternating (CSA at odd i of the interleave).
  if (has("layer_types")) {
    c.layer_types = j["layer_types"].get<std::vector<std::string>>();
  } else if (has("compress_ratios")) {
    for (int64_t r : j["compress_ratios"].get<std::vector<int64_t>>()) {
      if (r == 0)
        c.layer_types.push_back("sliding_attention");
      else if (r == 4)
        c.layer_types.push_back("compressed_sparse_attention");
      else if (r == 128)
        c.layer_types.push_back("heavily_compressed_attention");
      else
        throw std::runtime_error("reference: compress_ratios entries are 0, 4 or 128");
    }
  } else {
    for (int64_t i = 0; i < std::min<int64_t>(n, 2); ++i)
      c.layer_types.push_back("heavily_compressed_attention");
    for (int64_t i = 0; i < std::max<int64_t>(n - 2, 0); ++i)
      c.layer_types.push_back(i % 2 ? "compressed_sparse_attention"
                                    : "heavily_compressed_attention");
  }
  if (static_cast<int64_t>(c.layer_types.size()) < n)
    throw std::runtime_error("reference: fewer layer_types than num_hidden_layers");
  c.layer_types.resize(static_cast<size_t>(n));
  if (has("mlp_layer_types")) {
    c.mlp_layer_types = j["mlp_layer_types"].get<std::vector<std::string>>();
  } else {
    int64_t n_hash = 3;
    get_i("num_hash_layers", n_hash);
    for (int64_t i = 0; i < n; ++i) c.mlp_layer_types.push_back(i < n_hash ? "hash_moe" : "moe");
  }
  if (static_cast<int64_t>(c.mlp_layer_types.size()) < n)
    throw std::runtime_error("reference: fewer mlp_layer_types than num_hidden_layers");
  c.mlp_layer_types.resize(static_cast<size_t>(n));
  // partial_rotary_factor: explicit, else qk_rope_head_dim / head_dim, else 64 / 512.
  if (has("partial_rotary_factor"))
    c.partial_rotary_factor = j["partial_rotary_factor"].get<double>();
  else if (has("qk_rope_head_dim"))
    c.partial_rotary_factor = j["qk_rope_head_dim"].get<double>() / static_cast<double>(c.head_dim);
  get_i("max_position_embeddings", c.max_position_embeddings);
  // rope_parameters nested {main, compress} carry the thetas (main must be default rope); a
  // flat rope_parameters / rope_scaling is the compress rope's scaling. Only default and yarn.
  auto read_scaling = [&](const nlohmann::json& p) {
    const std::string type = p.value("rope_type", p.value("type", std::string("default")));
    if (type == "default") return;
    if (type != "yarn")
      throw std::runtime_error("reference: rope_type " + type + " is not restated");
    c.yarn = true;
    c.yarn_factor = p.at("factor").get<double>();
    if (p.contains("beta_fast") && !p["beta_fast"].is_null())
      c.beta_fast = p["beta_fast"].get<double>();
    if (p.contains("beta_slow") && !p["beta_slow"].is_null())
      c.beta_slow = p["beta_slow"].get<double>();
    c.original_max_position_embeddings =
        p.value("original_max_position_embeddings", c.max_position_embeddings);
    c.yarn_attention_factor = p.value("attention_factor", 1.0);
    c.yarn_truncate = p.value("truncate", true);
  };
  const char* key = has("rope_parameters") ? "rope_parameters"
                    : has("rope_scaling")  ? "rope_scaling"
                                           : nullptr;
  if (key != nullptr && j[key].is_object()) {
    const auto& rp = j[key];
    if (rp.contains("main") && rp["main"].is_object() && rp.contains("compress") &&
        rp["compress"].is_object()) {
      const auto& m = rp["main"];
      if (m.value("rope_type", std::string("default")) != "default")
        throw std::runtime_error("reference: the main rope is default rope in DeepSeek-V4");
      c.rope_theta = m.value("rope_theta", c.rope_theta);
      c.compress_rope_theta = rp["compress"].value("rope_theta", c.compress_rope_theta);
      if (m.contains("partial_rotary_factor"))
        c.partial_rotary_factor = m["partial_rotary_factor"].get<double>();
      read_scaling(rp["compress"]);
    } else {
      read_scaling(rp);
    }
  }
  return c;
}

// ---------------------------------------------------------------------------------------------
// Weights by their Hugging Face names. `dtype` is the safetensors dtype the writer stores
// ("F32", "BF16", "I32", "I64"); `data` already holds the values that dtype represents (BF16
// rounded), so the forward and the engine read the same numbers.
struct Param {
  std::vector<int64_t> shape;
  Vec data;
  std::string dtype = "F32";
};
using Weights = std::map<std::string, Param>;

inline float round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;  // round to nearest even
  std::memcpy(&f, &u, 4);
  return f;
}

// The safetensors container: u64 header length, the JSON header (name -> dtype, shape,
// data_offsets), the raw little-endian data.
inline void write_safetensors_file(const std::string& path, const Weights& w) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const auto& [name, p] : w) {
    const size_t begin = data.size();
    for (double v : p.data) {
      if (p.dtype == "F32") {
        const float f = static_cast<float>(v);
        data.append(reinterpret_cast<const char*>(&f), 4);
      } else if (p.dtype == "BF16") {
        const float f = round_bf16(static_cast<float>(v));
        uint32_t u;
        std::memcpy(&u, &f, 4);
        const uint16_t h = static_cast<uint16_t>(u >> 16);
        data.append(reinterpret_cast<const char*>(&h), 2);
      } else if (p.dtype == "I32") {
        const int32_t i = static_cast<int32_t>(v);
        data.append(reinterpret_cast<const char*>(&i), 4);
      } else if (p.dtype == "I64") {
        const int64_t i = static_cast<int64_t>(v);
        data.append(reinterpret_cast<const char*>(&i), 8);
      } else {
        throw std::runtime_error("writer: dtype " + p.dtype);
      }
    }
    header[name] = {{"dtype", p.dtype}, {"shape", p.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  const uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  if (!out) throw std::runtime_error("writer: cannot write " + path);
}

// A folder's config.json and model.safetensors (one file) read back, for folders this file did
// not write (the runtime's dummy preset).
inline std::pair<nlohmann::json, Weights> load_folder(const std::string& dir) {
  std::ifstream cj(dir + "/config.json");
  if (!cj) throw std::runtime_error("reference: no config.json in " + dir);
  nlohmann::json config = nlohmann::json::parse(cj);
  std::ifstream in(dir + "/model.safetensors", std::ios::binary);
  if (!in) throw std::runtime_error("reference: no model.safetensors in " + dir);
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  std::string h(n, ' ');
  in.read(h.data(), static_cast<std::streamsize>(n));
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Weights w;
  const nlohmann::json header = nlohmann::json::parse(h);
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") continue;
    Param p;
    p.shape = e["shape"].get<std::vector<int64_t>>();
    p.dtype = e["dtype"].get<std::string>();
    const size_t b = e["data_offsets"][0].get<size_t>(), end = e["data_offsets"][1].get<size_t>();
    const char* d = data.data() + b;
    auto read = [&](auto tag, auto conv) {
      using T = decltype(tag);
      for (size_t o = 0; o + sizeof(T) <= end - b; o += sizeof(T)) {
        T v;
        std::memcpy(&v, d + o, sizeof(T));
        p.data.push_back(conv(v));
      }
    };
    if (p.dtype == "F32") {
      read(float{}, [](float v) { return double{v}; });
    } else if (p.dtype == "BF16") {
      read(uint16_t{}, [](uint16_t v) {
        const uint32_t u = static_cast<uint32_t>(v) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return double{f};
      });
    } else if (p.dtype == "F16") {
      read(uint16_t{}, [](uint16_t v) {
        const int e5 = (v >> 10) & 0x1f, m = v & 0x3ff;
        const double s = (v & 0x8000) ? -1.0 : 1.0;
        if (e5 == 0) return s * std::ldexp(m, -24);
        if (e5 == 31) return m ? std::nan("") : s * std::numeric_limits<double>::infinity();
        return s * std::ldexp(1024 + m, e5 - 25);
      });
    } else if (p.dtype == "I32") {
      read(int32_t{}, [](int32_t v) { return static_cast<double>(v); });
    } else if (p.dtype == "I64") {
      read(int64_t{}, [](int64_t v) { return static_cast<double>(v); });
    } else {
      throw std::runtime_error("reference: tensor " + name + " has dtype " + p.dtype);
    }
    w[name] = std::move(p);
  }
  return {config, w};
}

// ---------------------------------------------------------------------------------------------
// Building blocks.

inline double silu(double x) {
  return x / (1.0 + std::exp(-x));
}
inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
// ACT2FN["sqrtsoftplus"]: sqrt(F.softplus(x)) (softplus: beta 1, identity above 20).
inline double sqrtsoftplus(double x) {
  return std::sqrt(x > 20.0 ? x : std::log1p(std::exp(x)));
}

// nn.Linear without bias: y[S, out] = x[S, in] W^T, W = [out, in].
inline Vec linear(const Vec& x, int64_t S, const Vec& w, int64_t out) {
  const int64_t in = static_cast<int64_t>(w.size()) / out;
  Vec y(static_cast<size_t>(S * out));
  for (int64_t t = 0; t < S; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += w[ix(o, i, in)] * x[ix(t, i, in)];
      y[ix(t, o, out)] = acc;
    }
  return y;
}

// DeepseekV4RMSNorm (plain weight, ones at init) when w is given, DeepseekV4UnweightedRMSNorm
// when not: x * rsqrt(mean(x^2) + eps) [* w], in place over every row of n.
inline void rms_norm(double* x, int64_t n, const Vec* w, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv * (w ? (*w)[static_cast<size_t>(i)] : 1.0);
}
inline void rms_norm_rows(Vec& x, int64_t n, const Vec* w, double eps) {
  for (size_t r = 0; r < x.size() / static_cast<size_t>(n); ++r)
    rms_norm(&x[r * static_cast<size_t>(n)], n, w, eps);
}

// apply_rotary_pos_emb: interleaved RoPE on the trailing rd channels of x[dim]: pair i is
// channels (dim-rd+2i, dim-rd+2i+1), angle pos * inv_freq[i]; x*cos + rotate_half(x)*sin with
// rotate_half(a, b) = (-b, a), cos and sin times the rope's scale. sign -1 is the output
// de-rotation (cos, -sin).
inline void rope(double* x, int64_t dim, int64_t rd, double pos, const Config::Rope& r,
                 double sign = 1) {
  double* y = x + (dim - rd);
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double inv = r.inv_freq[static_cast<size_t>(i)];
    const double c = r.scale * std::cos(pos * inv), s = r.scale * sign * std::sin(pos * inv);
    const double a = y[2 * i], b = y[2 * i + 1];
    y[2 * i] = a * c - b * s;
    y[2 * i + 1] = b * c + a * s;
  }
}

// DeepseekV4HyperConnection.forward for one token: streams x[hc * D] -> pre (collapse), post
// (expand), comb (hc x hc, Sinkhorn-projected).
struct HcWeights {
  Vec pre, post, comb;
};
inline HcWeights hyper_connection(const double* x, int64_t hc, int64_t D, const Vec& fn,
                                  const Vec& base, const Vec& scale, int64_t iters, double hc_eps,
                                  double norm_eps) {
  Vec flat(x, x + hc * D);
  rms_norm(flat.data(), hc * D, nullptr, norm_eps);  // input_norm (unweighted)
  const int64_t M = (2 + hc) * hc;
  const Vec mix = linear(flat, 1, fn, M);
  HcWeights o;
  o.pre.resize(static_cast<size_t>(hc));
  o.post.resize(static_cast<size_t>(hc));
  o.comb.resize(static_cast<size_t>(hc * hc));
  for (int64_t i = 0; i < hc; ++i) {
    const auto u = static_cast<size_t>(i);
    o.pre[u] = sigmoid(mix[u] * scale[0] + base[u]) + hc_eps;
    o.post[u] = 2.0 * sigmoid(mix[u + static_cast<size_t>(hc)] * scale[1] +
                              base[u + static_cast<size_t>(hc)]);
  }
  // comb: softmax over the last axis, + eps, then column / row normalisation: one column pass,
  // then (iters - 1) x (rows, columns).
  for (int64_t i = 0; i < hc; ++i) {
    double mx = kNegInf;
    Vec row(static_cast<size_t>(hc));
    for (int64_t j = 0; j < hc; ++j) {
      const size_t k = static_cast<size_t>(2 * hc + i * hc + j);
      row[static_cast<size_t>(j)] = mix[k] * scale[2] + base[k];
      mx = std::max(mx, row[static_cast<size_t>(j)]);
    }
    double sum = 0;
    for (double& v : row) sum += (v = std::exp(v - mx));
    for (int64_t j = 0; j < hc; ++j)
      o.comb[ix(i, j, hc)] = row[static_cast<size_t>(j)] / sum + hc_eps;
  }
  auto normalise = [&](bool rows) {
    for (int64_t a = 0; a < hc; ++a) {
      double sum = 0;
      for (int64_t b = 0; b < hc; ++b) sum += rows ? o.comb[ix(a, b, hc)] : o.comb[ix(b, a, hc)];
      for (int64_t b = 0; b < hc; ++b)
        (rows ? o.comb[ix(a, b, hc)] : o.comb[ix(b, a, hc)]) /= sum + hc_eps;
    }
  };
  normalise(false);
  for (int64_t it = 0; it + 1 < iters; ++it) {
    normalise(true);
    normalise(false);
  }
  return o;
}

// torch.topk over a row, ties to the lower index (the engine's stated rule; torch leaves it
// unspecified, so the forward counts the picks whose rank a tie decided: `tied`).
inline std::vector<int64_t> top_k(const Vec& s, int64_t k, int64_t* tied = nullptr) {
  std::vector<int64_t> idx(s.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int64_t>(i);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)];
  });
  if (tied != nullptr && k > 0 && static_cast<size_t>(k) < s.size()) {
    // A tie decides a pick when the last one picked equals one left out.
    const double last = s[static_cast<size_t>(idx[static_cast<size_t>(k - 1)])];
    if (std::isfinite(last) && s[static_cast<size_t>(idx[static_cast<size_t>(k)])] == last) ++*tied;
  }
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// ---------------------------------------------------------------------------------------------
// The forward.

// Deliberate departures from transformers, to show the comparisons can fail.
struct Faults {
  bool no_overlap = false;            // CSA: window w's entry without window w-1's Ca half
  bool hca_sees_open_window = false;  // HCA block bias w <= (t+1)//m instead of <
  bool no_output_derotation = false;  // skip the (cos, -sin) on the attention output
  bool no_sinks = false;              // drop the sink logit
  bool comb_not_transposed = false;   // mix streams with comb instead of comb^T
};

// What the forward saw, for the tests: how many top-k picks (indexer, routers) ties decided.
struct Stats {
  int64_t indexer_ties = 0, router_ties = 0;
};

class Reference {
 public:
  Reference(const nlohmann::json& config, Weights w, Faults f = {})
      : c_(parse_config(config)), w_(std::move(w)), f_(f) {}

  const Config& config() const { return c_; }
  const Stats& stats() const { return stats_; }

  // DeepseekV4ForCausalLM.forward with past_key_values=None: logits [S, vocab] of every
  // position, row-major.
  Vec logits(const std::vector<int32_t>& ids) const {
    const int64_t S = static_cast<int64_t>(ids.size()), D = c_.hidden_size, hc = c_.hc_mult;
    const Vec& emb = get("model.embed_tokens.weight");
    // hidden_states: [S, hc, D], every stream the embedding.
    Vec x(static_cast<size_t>(S * hc * D));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t k = 0; k < hc; ++k)
        for (int64_t d = 0; d < D; ++d)
          x[static_cast<size_t>((t * hc + k) * D + d)] = emb[ix(ids[static_cast<size_t>(t)], d, D)];
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) x = layer(l, x, ids);
    // DeepseekV4HyperHead, then model.norm, then lm_head.
    const std::string hp = "model.hc_head.";
    const Vec &hfn = get(hp + "hc_fn"), &hbase = get(hp + "hc_base"),
              &hscale = get(hp + "hc_scale");
    Vec h(static_cast<size_t>(S * D));
    for (int64_t t = 0; t < S; ++t) {
      Vec flat(x.begin() + t * hc * D, x.begin() + (t + 1) * hc * D);
      rms_norm(flat.data(), hc * D, nullptr, c_.rms_norm_eps);
      const Vec mix = linear(flat, 1, hfn, hc);
      for (int64_t k = 0; k < hc; ++k) {
        const double pre =
            sigmoid(mix[static_cast<size_t>(k)] * hscale[0] + hbase[static_cast<size_t>(k)]) +
            c_.hc_eps;
        for (int64_t d = 0; d < D; ++d)
          h[ix(t, d, D)] += pre * x[static_cast<size_t>((t * hc + k) * D + d)];
      }
    }
    rms_norm_rows(h, D, &get("model.norm.weight"), c_.rms_norm_eps);
    const bool tied = c_.tie_word_embeddings && !w_.count("lm_head.weight");
    return linear(h, S, get(tied ? "model.embed_tokens.weight" : "lm_head.weight"), c_.vocab_size);
  }

  // Greedy ids (argmax, lower id on ties), the prefix recomputed for each new token.
  std::vector<int32_t> greedy(std::vector<int32_t> ids, int64_t n) const {
    std::vector<int32_t> out;
    const auto V = static_cast<size_t>(c_.vocab_size);
    for (int64_t i = 0; i < n; ++i) {
      const Vec l = logits(ids);
      const auto last = l.end() - static_cast<std::ptrdiff_t>(V);
      const auto id = static_cast<int32_t>(std::max_element(last, l.end()) - last);
      out.push_back(id);
      ids.push_back(id);
    }
    return out;
  }

  const Vec& get(const std::string& name) const {
    auto it = w_.find(name);
    if (it == w_.end()) throw std::runtime_error("reference: no tensor " + name);
    return it->second.data;
  }

 private:
  // DeepseekV4DecoderLayer.forward: x [S, hc, D] -> [S, hc, D].
  Vec layer(int64_t l, const Vec& x, const std::vector<int32_t>& ids) const {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const int64_t S = static_cast<int64_t>(ids.size()), D = c_.hidden_size;
    Vec cur = x;
    for (int half = 0; half < 2; ++half) {
      const std::string hcp = p + (half == 0 ? "attn_hc." : "ffn_hc.");
      std::vector<HcWeights> hw;
      Vec collapsed(static_cast<size_t>(S * D));
      for (int64_t t = 0; t < S; ++t) {
        const double* xt = &cur[static_cast<size_t>(t * c_.hc_mult * D)];
        hw.push_back(hyper_connection(xt, c_.hc_mult, D, get(hcp + "fn"), get(hcp + "base"),
                                      get(hcp + "scale"), c_.hc_sinkhorn_iters, c_.hc_eps,
                                      c_.rms_norm_eps));
        for (int64_t k = 0; k < c_.hc_mult; ++k)
          for (int64_t d = 0; d < D; ++d)
            collapsed[ix(t, d, D)] += hw.back().pre[static_cast<size_t>(k)] * xt[k * D + d];
      }
      rms_norm_rows(
          collapsed, D,
          &get(p + (half == 0 ? "input_layernorm.weight" : "post_attention_layernorm.weight")),
          c_.rms_norm_eps);
      const Vec out = half == 0 ? attention(l, p + "self_attn.", collapsed, S)
                                : moe(l, p + "mlp.", collapsed, ids);
      // new[k] = post[k] * out + sum_j comb[j][k] * x[j]   (comb^T @ streams)
      Vec next(cur.size());
      const int64_t hc = c_.hc_mult;
      for (int64_t t = 0; t < S; ++t) {
        const HcWeights& h = hw[static_cast<size_t>(t)];
        for (int64_t k = 0; k < hc; ++k)
          for (int64_t d = 0; d < D; ++d) {
            double acc = h.post[static_cast<size_t>(k)] * out[ix(t, d, D)];
            for (int64_t j = 0; j < hc; ++j)
              acc += (f_.comb_not_transposed ? h.comb[ix(k, j, hc)] : h.comb[ix(j, k, hc)]) *
                     cur[static_cast<size_t>((t * hc + j) * D + d)];
            next[static_cast<size_t>((t * hc + k) * D + d)] = acc;
          }
      }
      cur = std::move(next);
    }
    return cur;
  }

  // The compressor's pooling (DeepseekV4HCACompressor / DeepseekV4CSACompressor /
  // DeepseekV4Indexer, stateless branch): every complete window of m tokens of kv / gate
  // ([S, width], width = dim or 2 * dim with overlap) becomes one entry of dim: per channel a
  // softmax over the window's slots of gate + position_bias, weighting kv; with overlap the slots
  // are window w-1's first half (Ca, [:dim]) then window w's second half (Cb, [dim:]), window 0's
  // Ca slots empty (-inf gate). Then kv_norm and RoPE (compress theta) at position w * m.
  Vec compress(const Vec& kv, const Vec& gate, const Vec& bias, const Vec& norm_w, int64_t S,
               int64_t m, int64_t dim, bool overlap) const {
    const int64_t width = overlap ? 2 * dim : dim, T = S / m;
    Vec out(static_cast<size_t>(T * dim));
    for (int64_t w = 0; w < T; ++w) {
      for (int64_t ch = 0; ch < dim; ++ch) {
        std::vector<std::pair<double, double>> slots;  // (gate logit, kv)
        for (int64_t j = 0; j < m; ++j) {
          if (!overlap) {
            const int64_t t = w * m + j;
            slots.emplace_back(gate[ix(t, ch, width)] + bias[ix(j, ch, width)],
                               kv[ix(t, ch, width)]);
            continue;
          }
          if (w > 0 && !f_.no_overlap) {
            const int64_t t = (w - 1) * m + j;
            slots.emplace_back(gate[ix(t, ch, width)] + bias[ix(j, ch, width)],
                               kv[ix(t, ch, width)]);
          }
        }
        if (overlap)
          for (int64_t j = 0; j < m; ++j) {
            const int64_t t = w * m + j;
            slots.emplace_back(gate[ix(t, dim + ch, width)] + bias[ix(j, dim + ch, width)],
                               kv[ix(t, dim + ch, width)]);
          }
        double mx = kNegInf, sum = 0, acc = 0;
        for (const auto& s : slots) mx = std::max(mx, s.first);
        for (const auto& s : slots) {
          const double e = std::exp(s.first - mx);
          sum += e;
          acc += e * s.second;
        }
        out[ix(w, ch, dim)] = acc / sum;
      }
      rms_norm(&out[ix(w, 0, dim)], dim, &norm_w, c_.rms_norm_eps);
      rope(&out[ix(w, 0, dim)], dim, c_.rope_dim(), static_cast<double>(w * m), compress_rope_);
    }
    return out;
  }

  // DeepseekV4Attention.forward (eager_attention_forward with sinks), no cache.
  Vec attention(int64_t l, const std::string& p, const Vec& h, int64_t S) const {
    const int64_t D = c_.hidden_size, H = c_.num_attention_heads, hd = c_.head_dim;
    const int64_t rd = c_.rope_dim();
    const bool compressed = c_.rate(l) > 0;
    const Config::Rope& theta = compressed ? compress_rope_ : main_rope_;
    // q_residual = q_a_norm(q_a_proj(h)); q = q_b_norm(q_b_proj(q_residual)) per head; RoPE.
    Vec qr = linear(h, S, get(p + "q_a_proj.weight"), c_.q_lora_rank);
    rms_norm_rows(qr, c_.q_lora_rank, &get(p + "q_a_norm.weight"), c_.rms_norm_eps);
    Vec q = linear(qr, S, get(p + "q_b_proj.weight"), H * hd);
    rms_norm_rows(q, hd, nullptr, c_.rms_norm_eps);
    for (int64_t t = 0; t < S; ++t)
      for (int64_t hh = 0; hh < H; ++hh)
        rope(&q[static_cast<size_t>((t * H + hh) * hd)], hd, rd, static_cast<double>(t), theta);
    // One shared K=V head: kv_norm(kv_proj(h)), RoPE.
    Vec kv = linear(h, S, get(p + "kv_proj.weight"), hd);
    rms_norm_rows(kv, hd, &get(p + "kv_norm.weight"), c_.rms_norm_eps);
    for (int64_t t = 0; t < S; ++t) rope(&kv[ix(t, 0, hd)], hd, rd, static_cast<double>(t), theta);

    // Compressed entries [T, hd] and their per-query bias [S, T].
    Vec entries, bias;
    int64_t T = 0;
    if (compressed) {
      const int64_t m = c_.rate(l);
      const std::string cp = p + "compressor.";
      const bool csa = c_.is_csa(l);
      const int64_t width = csa ? 2 * hd : hd;
      entries = compress(linear(h, S, get(cp + "kv_proj.weight"), width),
                         linear(h, S, get(cp + "gate_proj.weight"), width),
                         get(cp + "position_bias"), get(cp + "kv_norm.weight"), S, m, hd, csa);
      T = S / m;
      bias.assign(static_cast<size_t>(S * T), kNegInf);
      for (int64_t t = 0; t < S; ++t) {
        const int64_t thr = (t + 1) / m;  // entries of windows wholly at or before t
        if (!csa) {
          for (int64_t w = 0; w < T; ++w)
            if (w < thr || (f_.hca_sees_open_window && w == thr)) bias[ix(t, w, T)] = 0;
        }
      }
      if (csa) {
        const std::vector<std::vector<int64_t>> picks = indexer(cp + "indexer.", h, qr, S, m);
        for (int64_t t = 0; t < S; ++t)
          for (int64_t w : picks[static_cast<size_t>(t)])
            if (w >= 0) bias[ix(t, w, T)] = 0;
      }
    }

    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    const Vec& sinks = get(p + "sinks");
    Vec o(static_cast<size_t>(S * H * hd));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t hh = 0; hh < H; ++hh) {
        const double* qv = &q[static_cast<size_t>((t * H + hh) * hd)];
        std::vector<std::pair<double, const double*>> keys;  // (logit, value row)
        // Sliding window: key s visible iff s <= t and t - s < sliding_window.
        for (int64_t s = std::max<int64_t>(0, t - c_.sliding_window + 1); s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qv[i] * kv[ix(s, i, hd)];
          keys.emplace_back(dot * scale, &kv[ix(s, 0, hd)]);
        }
        for (int64_t w = 0; w < T; ++w) {
          if (bias[ix(t, w, T)] == kNegInf) continue;
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qv[i] * entries[ix(w, i, hd)];
          keys.emplace_back(dot * scale, &entries[ix(w, 0, hd)]);
        }
        double mx = f_.no_sinks ? kNegInf : sinks[static_cast<size_t>(hh)];
        for (const auto& k : keys) mx = std::max(mx, k.first);
        double sum = f_.no_sinks ? 0.0 : std::exp(sinks[static_cast<size_t>(hh)] - mx);
        for (const auto& k : keys) sum += std::exp(k.first - mx);
        double* ov = &o[static_cast<size_t>((t * H + hh) * hd)];
        for (const auto& k : keys) {
          const double pr = std::exp(k.first - mx) / sum;
          for (int64_t i = 0; i < hd; ++i) ov[i] += pr * k.second[i];
        }
        if (!f_.no_output_derotation) rope(ov, hd, rd, static_cast<double>(t), theta, -1.0);
      }
    // DeepseekV4GroupedLinear (o_a_proj): group g of the [H * hd] output (H * hd / G values)
    // times rows [g * r, (g + 1) * r) of the weight; then o_b_proj.
    const int64_t G = c_.o_groups, r = c_.o_lora_rank, in_g = H * hd / G;
    const Vec& wa = get(p + "o_a_proj.weight");
    Vec mid(static_cast<size_t>(S * G * r));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t g = 0; g < G; ++g)
        for (int64_t j = 0; j < r; ++j) {
          double acc = 0;
          for (int64_t i = 0; i < in_g; ++i)
            acc += wa[ix(g * r + j, i, in_g)] * o[static_cast<size_t>(t * H * hd + g * in_g + i)];
          mid[ix(t, g * r + j, G * r)] = acc;
        }
    return linear(mid, S, get(p + "o_b_proj.weight"), D);
  }

  // DeepseekV4Indexer.forward, stateless: top-index_topk compressed indexer entries per query,
  // -1 for picks past the causal threshold (t + 1) // m.
  std::vector<std::vector<int64_t>> indexer(const std::string& p, const Vec& h, const Vec& qr,
                                            int64_t S, int64_t m) const {
    const int64_t ihd = c_.index_head_dim, nh = c_.index_n_heads, T = S / m;
    const Vec keys = compress(linear(h, S, get(p + "kv_proj.weight"), 2 * ihd),
                              linear(h, S, get(p + "gate_proj.weight"), 2 * ihd),
                              get(p + "position_bias"), get(p + "kv_norm.weight"), S, m, ihd, true);
    Vec q = linear(qr, S, get(p + "q_b_proj.weight"), nh * ihd);
    for (int64_t t = 0; t < S; ++t)
      for (int64_t hh = 0; hh < nh; ++hh)
        rope(&q[static_cast<size_t>((t * nh + hh) * ihd)], ihd, c_.rope_dim(),
             static_cast<double>(t), compress_rope_);
    const Vec hw = linear(h, S, get(p + "scorer.weights_proj.weight"), nh);
    const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(ihd));
    const double weights_scale = 1.0 / std::sqrt(static_cast<double>(nh));
    const int64_t k = std::min(c_.index_topk, T);
    std::vector<std::vector<int64_t>> picks(static_cast<size_t>(S));
    for (int64_t t = 0; t < S; ++t) {
      const int64_t thr = (t + 1) / m;
      Vec score(static_cast<size_t>(T), kNegInf);
      for (int64_t w = 0; w < thr && w < T; ++w) {
        double acc = 0;
        for (int64_t hh = 0; hh < nh; ++hh) {
          double dot = 0;
          for (int64_t i = 0; i < ihd; ++i)
            dot += q[static_cast<size_t>((t * nh + hh) * ihd + i)] * keys[ix(w, i, ihd)];
          acc += std::max(dot, 0.0) * softmax_scale * hw[ix(t, hh, nh)] * weights_scale;
        }
        score[static_cast<size_t>(w)] = acc;
      }
      for (int64_t w : top_k(score, k, &stats_.indexer_ties))
        picks[static_cast<size_t>(t)].push_back(w >= thr ? -1 : w);
    }
    return picks;
  }

  // DeepseekV4SparseMoeBlock: routed experts (hash or scored top-k) + the shared expert.
  Vec moe(int64_t l, const std::string& p, const Vec& h, const std::vector<int32_t>& ids) const {
    const int64_t S = static_cast<int64_t>(ids.size()), D = c_.hidden_size, E = c_.n_routed_experts;
    const int64_t I = c_.moe_intermediate_size, K = c_.num_experts_per_tok;
    const double lim = c_.swiglu_limit;
    const Vec logits = linear(h, S, get(p + "gate.weight"), E);
    const Vec& gu = get(p + "experts.gate_up_proj");  // [E, 2I, D]
    const Vec& dn = get(p + "experts.down_proj");     // [E, D, I]
    // DeepseekV4MLP / DeepseekV4Experts._apply_gate: silu(min(gate, lim)) * clamp(up, +-lim).
    auto swiglu = [&](double g, double u) {
      return silu(std::min(g, lim)) * std::clamp(u, -lim, lim);
    };
    Vec out(static_cast<size_t>(S * D));
    for (int64_t t = 0; t < S; ++t) {
      Vec score(static_cast<size_t>(E));
      const double* lg = &logits[ix(t, 0, E)];
      if (c_.scoring_func == "sqrtsoftplus") {
        for (int64_t e = 0; e < E; ++e) score[static_cast<size_t>(e)] = sqrtsoftplus(lg[e]);
      } else if (c_.scoring_func == "sigmoid") {
        for (int64_t e = 0; e < E; ++e) score[static_cast<size_t>(e)] = sigmoid(lg[e]);
      } else if (c_.scoring_func == "softmax") {
        const double mx = *std::max_element(lg, lg + E);
        double sum = 0;
        for (int64_t e = 0; e < E; ++e)
          sum += (score[static_cast<size_t>(e)] = std::exp(lg[e] - mx));
        for (double& v : score) v /= sum;
      } else {
        throw std::runtime_error("reference: scoring_func " + c_.scoring_func);
      }
      std::vector<int64_t> sel;
      if (c_.is_hash(l)) {  // DeepseekV4HashRouter: tid2eid[input_id]
        const Vec& tab = get(p + "gate.tid2eid");
        for (int64_t k = 0; k < K; ++k)
          sel.push_back(static_cast<int64_t>(tab[ix(ids[static_cast<size_t>(t)], k, K)]));
      } else {  // DeepseekV4TopKRouter: top-k of score + e_score_correction_bias
        const Vec& cb = get(p + "gate.e_score_correction_bias");
        Vec biased(score);
        for (int64_t e = 0; e < E; ++e)
          biased[static_cast<size_t>(e)] += cb[static_cast<size_t>(e)];
        sel = top_k(biased, K, &stats_.router_ties);
      }
      double wsum = 0;
      for (int64_t e : sel) wsum += score[static_cast<size_t>(e)];
      for (int64_t e : sel) {
        const double wgt =
            score[static_cast<size_t>(e)] / (wsum + 1e-20) * c_.routed_scaling_factor;
        Vec act(static_cast<size_t>(I));
        for (int64_t i = 0; i < I; ++i) {
          double g = 0, u = 0;
          for (int64_t d = 0; d < D; ++d) {
            g += gu[static_cast<size_t>((e * 2 * I + i) * D + d)] * h[ix(t, d, D)];
            u += gu[static_cast<size_t>((e * 2 * I + I + i) * D + d)] * h[ix(t, d, D)];
          }
          act[static_cast<size_t>(i)] = swiglu(g, u);
        }
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t i = 0; i < I; ++i)
            acc += dn[static_cast<size_t>((e * D + d) * I + i)] * act[static_cast<size_t>(i)];
          out[ix(t, d, D)] += wgt * acc;
        }
      }
    }
    // shared_experts: DeepseekV4MLP at intermediate_size = moe_intermediate_size.
    const Vec g = linear(h, S, get(p + "shared_experts.gate_proj.weight"), I);
    const Vec u = linear(h, S, get(p + "shared_experts.up_proj.weight"), I);
    Vec act(g.size());
    for (size_t i = 0; i < g.size(); ++i) act[i] = swiglu(g[i], u[i]);
    const Vec sh = linear(act, S, get(p + "shared_experts.down_proj.weight"), D);
    for (size_t i = 0; i < out.size(); ++i) out[i] += sh[i];
    return out;
  }

  Config c_;
  Config::Rope main_rope_ = c_.main_rope(), compress_rope_ = c_.compress_rope();
  Weights w_;
  Faults f_;
  mutable Stats stats_;
};

// ---------------------------------------------------------------------------------------------
// A tiny DeepSeek-V4: config.json in transformers' current keys (layer_types, compress_rates,
// mlp_layer_types, partial_rotary_factor; `legacy_keys` writes compress_ratios,
// compress_rate_csa / _hca, num_hash_layers and qk_rope_head_dim instead) and seeded random
// weights scaled so that every part moves the logits (norm weights near 1, position biases,
// sinks and the hyper-connection mixers away from their zero init, swiglu_limit low enough to
// clamp some activations).
struct TinySpec {
  int64_t vocab = 128, hidden = 64, heads = 4, head_dim = 32, rope_dim = 8, q_lora_rank = 32;
  std::vector<std::string> layer_types = {
      "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
      "compressed_sparse_attention", "heavily_compressed_attention"};
  std::vector<std::string> mlp_layer_types = {"hash_moe", "hash_moe", "moe", "moe", "moe"};
  int64_t rate_csa = 4, rate_hca = 8, sliding_window = 8;
  int64_t o_groups = 2, o_lora_rank = 16;
  int64_t index_n_heads = 8, index_head_dim = 16, index_topk = 3;
  int64_t hc_mult = 4, hc_sinkhorn_iters = 20;
  int64_t experts = 4, top_k = 2, moe_intermediate = 32;
  double routed_scaling_factor = 1.5, swiglu_limit = 1.5;
  double rope_theta = 10000.0, compress_rope_theta = 160000.0, rms_norm_eps = 1e-6;
  bool legacy_keys = false;
  // > 0: YaRN on the compress rope (rope_parameters, original context 64, max_position 256).
  double yarn_factor = 0;
  std::string matrix_dtype = "F32";   // or "BF16" (vectors stay F32)
  std::string tid2eid_dtype = "I64";  // transformers' buffer is torch.long
  uint64_t seed = 7;
};

struct Tiny {
  nlohmann::json config;
  Weights weights;
};

inline Tiny make_tiny(const TinySpec& s) {
  const int64_t L = static_cast<int64_t>(s.layer_types.size());
  Tiny tiny;
  nlohmann::json& j = tiny.config;
  j = {{"architectures", {"DeepseekV4ForCausalLM"}},
       {"model_type", "deepseek_v4"},
       {"vocab_size", s.vocab},
       {"hidden_size", s.hidden},
       {"moe_intermediate_size", s.moe_intermediate},
       {"num_hidden_layers", L},
       {"num_attention_heads", s.heads},
       {"num_key_value_heads", 1},
       {"head_dim", s.head_dim},
       {"q_lora_rank", s.q_lora_rank},
       {"num_experts_per_tok", s.top_k},
       {"n_routed_experts", s.experts},
       {"n_shared_experts", 1},
       {"scoring_func", "sqrtsoftplus"},
       {"norm_topk_prob", true},
       {"routed_scaling_factor", s.routed_scaling_factor},
       {"max_position_embeddings", 4096},
       {"rope_theta", s.rope_theta},
       {"compress_rope_theta", s.compress_rope_theta},
       {"hc_mult", s.hc_mult},
       {"hc_sinkhorn_iters", s.hc_sinkhorn_iters},
       {"hc_eps", 1e-6},
       {"swiglu_limit", s.swiglu_limit},
       {"sliding_window", s.sliding_window},
       {"o_groups", s.o_groups},
       {"o_lora_rank", s.o_lora_rank},
       {"index_n_heads", s.index_n_heads},
       {"index_head_dim", s.index_head_dim},
       {"index_topk", s.index_topk},
       {"num_nextn_predict_layers", 0},
       {"hidden_act", "silu"},
       {"rms_norm_eps", s.rms_norm_eps},
       {"tie_word_embeddings", false},
       {"bos_token_id", 0},
       {"eos_token_id", 1},
       {"torch_dtype", s.matrix_dtype == "BF16" ? "bfloat16" : "float32"}};
  if (s.legacy_keys) {
    std::vector<int64_t> ratios;
    for (const std::string& t : s.layer_types)
      ratios.push_back(t == "sliding_attention" ? 0 : t == "compressed_sparse_attention" ? 4 : 128);
    j["compress_ratios"] = ratios;
    j["compress_rate_csa"] = s.rate_csa;
    j["compress_rate_hca"] = s.rate_hca;
    int64_t n_hash = 0;
    while (n_hash < L && s.mlp_layer_types[static_cast<size_t>(n_hash)] == "hash_moe") ++n_hash;
    j["num_hash_layers"] = n_hash;
    j["qk_rope_head_dim"] = s.rope_dim;
  } else {
    j["layer_types"] = s.layer_types;
    j["compress_rates"] = {{"compressed_sparse_attention", s.rate_csa},
                           {"heavily_compressed_attention", s.rate_hca}};
    j["mlp_layer_types"] = s.mlp_layer_types;
    j["partial_rotary_factor"] = static_cast<double>(s.rope_dim) / static_cast<double>(s.head_dim);
  }

  if (s.yarn_factor > 0) {
    j["max_position_embeddings"] = 256;
    j["rope_parameters"] = {{"rope_type", "yarn"},
                            {"factor", s.yarn_factor},
                            {"beta_fast", 32.0},
                            {"beta_slow", 1.0},
                            {"original_max_position_embeddings", 64}};
  }
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  Weights& w = tiny.weights;
  auto put = [&](const std::string& name, std::vector<int64_t> shape, const std::string& dt,
                 double mean, double sd) {
    Param p;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    p.shape = std::move(shape);
    p.dtype = dt;
    for (int64_t i = 0; i < n; ++i) {
      const float f = static_cast<float>(mean + sd * normal(rng));
      p.data.push_back(dt == "BF16" ? round_bf16(f) : f);
    }
    w[name] = std::move(p);
  };
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    put(name, {out, in}, s.matrix_dtype, 0.0, 1.0 / std::sqrt(static_cast<double>(in)));
  };
  auto norm = [&](const std::string& name, int64_t n) { put(name, {n}, "F32", 1.0, 0.1); };
  const int64_t D = s.hidden, hc = s.hc_mult, hd = s.head_dim, I = s.moe_intermediate;
  auto hc_params = [&](const std::string& p, int64_t rows, bool head) {
    put(p + (head ? "hc_fn" : "fn"), {rows, hc * D}, "F32", 0.0,
        0.7 / std::sqrt(static_cast<double>(hc * D)));
    put(p + (head ? "hc_base" : "base"), {rows}, "F32", 0.0, 0.5);
    put(p + (head ? "hc_scale" : "scale"), {head ? 1 : 3}, "F32", 1.0, 0.2);
  };
  put("model.embed_tokens.weight", {s.vocab, D}, s.matrix_dtype, 0.0, 1.0);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string& type = s.layer_types[static_cast<size_t>(l)];
    norm(p + "input_layernorm.weight", D);
    norm(p + "post_attention_layernorm.weight", D);
    hc_params(p + "attn_hc.", (2 + hc) * hc, false);
    hc_params(p + "ffn_hc.", (2 + hc) * hc, false);
    const std::string a = p + "self_attn.";
    matrix(a + "q_a_proj.weight", s.q_lora_rank, D);
    norm(a + "q_a_norm.weight", s.q_lora_rank);
    matrix(a + "q_b_proj.weight", s.heads * hd, s.q_lora_rank);
    matrix(a + "kv_proj.weight", hd, D);
    norm(a + "kv_norm.weight", hd);
    matrix(a + "o_a_proj.weight", s.o_groups * s.o_lora_rank, s.heads * hd / s.o_groups);
    matrix(a + "o_b_proj.weight", D, s.o_groups * s.o_lora_rank);
    put(a + "sinks", {s.heads}, "F32", 0.0, 0.5);
    if (type != "sliding_attention") {
      const bool csa = type == "compressed_sparse_attention";
      const int64_t m = csa ? s.rate_csa : s.rate_hca, width = csa ? 2 * hd : hd;
      const std::string c = a + "compressor.";
      matrix(c + "kv_proj.weight", width, D);
      matrix(c + "gate_proj.weight", width, D);
      put(c + "position_bias", {m, width}, "F32", 0.0, 0.5);
      norm(c + "kv_norm.weight", hd);
      if (csa) {
        const std::string x = c + "indexer.";
        const int64_t ihd = s.index_head_dim;
        matrix(x + "kv_proj.weight", 2 * ihd, D);
        matrix(x + "gate_proj.weight", 2 * ihd, D);
        put(x + "position_bias", {m, 2 * ihd}, "F32", 0.0, 0.5);
        norm(x + "kv_norm.weight", ihd);
        matrix(x + "q_b_proj.weight", s.index_n_heads * ihd, s.q_lora_rank);
        matrix(x + "scorer.weights_proj.weight", s.index_n_heads, D);
      }
    }
    const std::string m = p + "mlp.";
    matrix(m + "gate.weight", s.experts, D);
    if (s.mlp_layer_types[static_cast<size_t>(l)] == "hash_moe") {
      // Distinct experts per token: a rotation of a shuffled list.
      Param t;
      t.shape = {s.vocab, s.top_k};
      t.dtype = s.tid2eid_dtype;
      std::vector<int64_t> order(static_cast<size_t>(s.experts));
      for (int64_t v = 0; v < s.vocab; ++v) {
        for (int64_t e = 0; e < s.experts; ++e) order[static_cast<size_t>(e)] = e;
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t k = 0; k < s.top_k; ++k)
          t.data.push_back(static_cast<double>(order[static_cast<size_t>(k)]));
      }
      w[m + "gate.tid2eid"] = std::move(t);
    } else {
      put(m + "gate.e_score_correction_bias", {s.experts}, "F32", 0.0, 0.1);
    }
    put(m + "experts.gate_up_proj", {s.experts, 2 * I, D}, s.matrix_dtype, 0.0,
        1.0 / std::sqrt(static_cast<double>(D)));
    put(m + "experts.down_proj", {s.experts, D, I}, s.matrix_dtype, 0.0,
        1.0 / std::sqrt(static_cast<double>(I)));
    matrix(m + "shared_experts.gate_proj.weight", I, D);
    matrix(m + "shared_experts.up_proj.weight", I, D);
    matrix(m + "shared_experts.down_proj.weight", D, I);
  }
  norm("model.norm.weight", D);
  hc_params("model.hc_head.", hc, true);
  matrix("lm_head.weight", s.vocab, D);
  return tiny;
}

inline void write_folder(const std::string& dir, const Tiny& tiny) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << tiny.config.dump(2);
  write_safetensors_file(dir + "/model.safetensors", tiny.weights);
}

}  // namespace kvcache::testing_util::dsv4
