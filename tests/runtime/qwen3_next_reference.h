// An independent no-cache forward of the Qwen3-Next family (issue 38, "How it is checked"),
// in double precision, written from transformers' models/qwen3_next/modeling_qwen3_next.py and
// configuration_qwen3_next.py (each step names the class or function it restates). It shares
// no code with src/model or src/kernels: the config is read from the folder's config.json with
// nlohmann::json here (not the runtime's ModelConfig), the weights by their Hugging Face names
// straight from the .safetensors file(s) (SafetensorsFile only parses the container; no name
// mapping, no loader), and every step is a plain loop over std::vector<double>.
//
// Also here: a writer of a tiny Qwen3-Next folder (config.json + model.safetensors with the
// checkpoint's tensor names and seeded random weights), so the tests need nothing from the
// runtime's dummy presets.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"
#include "model/safetensors.h"

namespace kvcache::testing_util::q3n {

using Vec = std::vector<double>;

inline size_t at(int64_t r, int64_t c, int64_t ld) {
  return static_cast<size_t>(r * ld + c);
}

// ---------------------------------------------------------------------------------------------
// Config: Qwen3NextConfig (configuration_qwen3_next.py), the fields the forward reads, with the
// class's defaults where config.json may leave a key out.
struct Config {
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 256;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0, partial_rotary_factor = 0.25;
  bool attention_bias = false, tie_word_embeddings = false;
  int64_t linear_conv_kernel_dim = 4, linear_key_head_dim = 128, linear_value_head_dim = 128;
  int64_t linear_num_key_heads = 16, linear_num_value_heads = 32;
  int64_t decoder_sparse_step = 1, moe_intermediate_size = 512;
  int64_t shared_expert_intermediate_size = 512, num_experts_per_tok = 10, num_experts = 512;
  bool norm_topk_prob = true;
  std::vector<int64_t> mlp_only_layers;
  std::vector<std::string> layer_types;

  bool is_linear(int64_t l) const {
    return layer_types[static_cast<size_t>(l)] == "linear_attention";
  }
  // Qwen3NextDecoderLayer.__init__: Qwen3NextSparseMoeBlock when the layer is not in
  // mlp_only_layers and num_experts > 0 and (layer_idx + 1) % decoder_sparse_step == 0.
  bool is_moe(int64_t l) const {
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), l) == mlp_only_layers.end() &&
           num_experts > 0 && (l + 1) % decoder_sparse_step == 0;
  }
  // Qwen3NextRotaryEmbedding.compute_default_rope_parameters: dim = int(head_dim * factor).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
};

inline Config parse_config(const nlohmann::json& j) {
  Config c;
  auto get_i = [&](const char* k, int64_t& v) {
    if (j.contains(k) && !j[k].is_null()) v = j[k].get<int64_t>();
  };
  auto get_d = [&](const char* k, double& v) {
    if (j.contains(k) && !j[k].is_null()) v = j[k].get<double>();
  };
  auto get_b = [&](const char* k, bool& v) {
    if (j.contains(k) && !j[k].is_null()) v = j[k].get<bool>();
  };
  get_i("vocab_size", c.vocab_size);
  get_i("hidden_size", c.hidden_size);
  get_i("intermediate_size", c.intermediate_size);
  get_i("num_hidden_layers", c.num_hidden_layers);
  get_i("num_attention_heads", c.num_attention_heads);
  get_i("num_key_value_heads", c.num_key_value_heads);
  get_i("head_dim", c.head_dim);
  get_d("rms_norm_eps", c.rms_norm_eps);
  // rope_theta / partial_rotary_factor: top level in the published config.json (v4), inside
  // rope_parameters in v5 (Qwen3NextConfig.__post_init__ sets the factor's default 0.25).
  get_d("rope_theta", c.rope_theta);
  get_d("partial_rotary_factor", c.partial_rotary_factor);
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    const nlohmann::json& r = j["rope_parameters"];
    if (r.contains("rope_type") && r["rope_type"] != "default")
      throw std::runtime_error("reference: only the default rope_type is restated");
    if (r.contains("rope_theta")) c.rope_theta = r["rope_theta"].get<double>();
    if (r.contains("partial_rotary_factor"))
      c.partial_rotary_factor = r["partial_rotary_factor"].get<double>();
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw std::runtime_error("reference: rope_scaling is not restated");
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    throw std::runtime_error("reference: only hidden_act silu is restated");
  get_b("attention_bias", c.attention_bias);
  get_b("tie_word_embeddings", c.tie_word_embeddings);
  get_i("linear_conv_kernel_dim", c.linear_conv_kernel_dim);
  get_i("linear_key_head_dim", c.linear_key_head_dim);
  get_i("linear_value_head_dim", c.linear_value_head_dim);
  get_i("linear_num_key_heads", c.linear_num_key_heads);
  get_i("linear_num_value_heads", c.linear_num_value_heads);
  get_i("decoder_sparse_step", c.decoder_sparse_step);
  get_i("moe_intermediate_size", c.moe_intermediate_size);
  get_i("shared_expert_intermediate_size", c.shared_expert_intermediate_size);
  get_i("num_experts_per_tok", c.num_experts_per_tok);
  get_i("num_experts", c.num_experts);
  get_b("norm_topk_prob", c.norm_topk_prob);
  if (j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array())
    c.mlp_only_layers = j["mlp_only_layers"].get<std::vector<int64_t>>();
  // Qwen3NextConfig.__post_init__: layer_types as given, else from full_attention_interval
  // (default 4): "linear_attention" if (i + 1) % interval else "full_attention".
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    c.layer_types = j["layer_types"].get<std::vector<std::string>>();
  } else {
    int64_t interval = 4;
    get_i("full_attention_interval", interval);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i)
      c.layer_types.push_back((i + 1) % interval != 0 ? "linear_attention" : "full_attention");
  }
  if (static_cast<int64_t>(c.layer_types.size()) != c.num_hidden_layers)
    throw std::runtime_error("reference: layer_types does not have num_hidden_layers entries");
  return c;
}

inline Config read_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) throw std::runtime_error("reference: no config.json in " + dir);
  return parse_config(nlohmann::json::parse(in));
}

// ---------------------------------------------------------------------------------------------
// Weights by their Hugging Face names, from model.safetensors or the shards that
// model.safetensors.index.json lists, as doubles.
class Weights {
 public:
  explicit Weights(const std::string& dir) {
    std::vector<std::string> files;
    const std::filesystem::path index = std::filesystem::path(dir) / "model.safetensors.index.json";
    if (std::filesystem::exists(index)) {
      std::ifstream in(index);
      std::set<std::string> seen;
      for (const auto& [name, file] : nlohmann::json::parse(in)["weight_map"].items())
        if (seen.insert(file.get<std::string>()).second) files.push_back(file.get<std::string>());
    } else {
      files.push_back("model.safetensors");
    }
    for (const std::string& f : files) {
      auto st = SafetensorsFile::open(dir + "/" + f);
      for (const auto& [name, view] : st->tensors()) where_[name] = files_.size();
      files_.push_back(st);
    }
  }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  const TensorView& view(const std::string& name) const {
    auto it = where_.find(name);
    if (it == where_.end()) throw std::runtime_error("reference: no tensor " + name);
    return files_[it->second]->tensors().at(name);
  }
  Vec get(const std::string& name) const {
    const TensorView& t = view(name);
    std::vector<float> f(static_cast<size_t>(t.numel()));
    convert_n(t.data(), t.dtype(), f.data(), DType::kF32, f.size());
    return Vec(f.begin(), f.end());
  }
  int64_t rows(const std::string& name) const { return view(name).dim(0); }

 private:
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;
};

// ---------------------------------------------------------------------------------------------
// Building blocks.

// nn.Linear: y[S, out] = x[S, in] W^T (+ b), W = [out, in].
inline Vec linear(const Vec& x, int64_t S, const Vec& w, int64_t out, const Vec& b = {}) {
  const int64_t in = static_cast<int64_t>(w.size()) / out;
  Vec y(static_cast<size_t>(S * out));
  for (int64_t t = 0; t < S; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double acc = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < in; ++i) acc += w[at(o, i, in)] * x[at(t, i, in)];
      y[at(t, o, out)] = acc;
    }
  return y;
}

inline double silu(double x) {
  return x / (1.0 + std::exp(-x));
}
inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
// F.softplus (beta 1, threshold 20: the identity above 20).
inline double softplus(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}

// Qwen3NextRMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w) (zero-centred weight), per row of n.
inline Vec rms_norm_1p(const Vec& x, int64_t n, const Vec& w, double eps) {
  Vec y(x.size());
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[at(r, i, n)] * x[at(r, i, n)];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      y[at(r, i, n)] = x[at(r, i, n)] * inv * (1.0 + w[static_cast<size_t>(i)]);
  }
  return y;
}

// Qwen3NextRMSNormGated: w * (x * rsqrt(mean(x^2) + eps)) * silu(gate) (plain weight, norm
// before gate), per row of n.
inline Vec rms_norm_gated(const Vec& x, const Vec& gate, int64_t n, const Vec& w, double eps) {
  Vec y(x.size());
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += x[at(r, i, n)] * x[at(r, i, n)];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      y[at(r, i, n)] = w[static_cast<size_t>(i)] * (x[at(r, i, n)] * inv) * silu(gate[at(r, i, n)]);
  }
  return y;
}

// l2norm (modeling_qwen3_next.py, aligned with FLA): x * rsqrt(sum(x^2) + eps), eps 1e-6.
inline void l2norm(double* x, int64_t n, double eps = 1e-6) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss + eps);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// ---------------------------------------------------------------------------------------------
// Gated delta rule. Inputs token-major as the module produces them: q, k [T, H, dk], v [T, H,
// dv], g, beta [T, H] (q, k already repeat_interleaved to the H value heads). Output [T, H, dv].
struct DeltaInputs {
  int64_t T = 0, H = 0, dk = 0, dv = 0;
  Vec q, k, v, g, beta;
};

// use_qk_l2norm_in_kernel=True: both rules start with l2norm(q), l2norm(k) (eps 1e-6), then
// query * dk^-0.5.
inline void normalise_qk(DeltaInputs& in) {
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t h = 0; h < in.H; ++h) {
      l2norm(&in.q[static_cast<size_t>((t * in.H + h) * in.dk)], in.dk);
      l2norm(&in.k[static_cast<size_t>((t * in.H + h) * in.dk)], in.dk);
    }
  const double scale = 1.0 / std::sqrt(static_cast<double>(in.dk));
  for (double& x : in.q) x *= scale;
}

// torch_recurrent_gated_delta_rule, per head with S [dk, dv] from zero:
//   S <- S * exp(g_t); kv_mem = k_t^T S; delta = (v_t - kv_mem) * beta_t;
//   S <- S + k_t (outer) delta; o_t = q_t^T S.
inline Vec recurrent_gated_delta_rule(DeltaInputs in) {
  normalise_qk(in);
  const int64_t T = in.T, H = in.H, dk = in.dk, dv = in.dv;
  Vec out(static_cast<size_t>(T * H * dv));
  for (int64_t h = 0; h < H; ++h) {
    Vec S(static_cast<size_t>(dk * dv), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      const double* q = &in.q[static_cast<size_t>((t * H + h) * dk)];
      const double* k = &in.k[static_cast<size_t>((t * H + h) * dk)];
      const double* v = &in.v[static_cast<size_t>((t * H + h) * dv)];
      const double decay = std::exp(in.g[at(t, h, H)]), beta = in.beta[at(t, h, H)];
      for (double& s : S) s *= decay;
      for (int64_t e = 0; e < dv; ++e) {
        double mem = 0;
        for (int64_t i = 0; i < dk; ++i) mem += S[at(i, e, dv)] * k[i];
        const double delta = (v[e] - mem) * beta;
        for (int64_t i = 0; i < dk; ++i) S[at(i, e, dv)] += k[i] * delta;
      }
      for (int64_t e = 0; e < dv; ++e) {
        double o = 0;
        for (int64_t i = 0; i < dk; ++i) o += S[at(i, e, dv)] * q[i];
        out[static_cast<size_t>((t * H + h) * dv + e)] = o;
      }
    }
  }
  return out;
}

// torch_chunk_gated_delta_rule restated chunk by chunk (chunk_size C, zero-padded to a
// multiple of C), per head: within a chunk gc = cumsum(g), decay[i][j] = exp(gc_i - gc_j)
// (j <= i); A = -(k_beta k^T * decay) strictly below the diagonal, then the row recursion
// A[i, :i] += A[i, :i] A[:i, :i], A += I; value = A v_beta, k_cumdecay = A (k_beta exp(gc));
// per chunk with the carried state S: v_new = value - k_cumdecay S,
// o = (q exp(gc)) S + (q k^T * decay, j <= i) v_new,
// S <- S exp(gc_last) + sum_i (k_i exp(gc_last - gc_i)) (outer) v_new_i.
inline Vec chunk_gated_delta_rule(DeltaInputs in, int64_t C) {
  normalise_qk(in);
  const int64_t T = in.T, H = in.H, dk = in.dk, dv = in.dv;
  const int64_t Tp = (T + C - 1) / C * C;
  Vec out(static_cast<size_t>(T * H * dv));
  for (int64_t h = 0; h < H; ++h) {
    // This head's padded sequences.
    Vec q(static_cast<size_t>(Tp * dk), 0.0), k(q.size(), 0.0),
        v(static_cast<size_t>(Tp * dv), 0.0);
    Vec g(static_cast<size_t>(Tp), 0.0), beta(static_cast<size_t>(Tp), 0.0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < dk; ++i) {
        q[at(t, i, dk)] = in.q[static_cast<size_t>((t * H + h) * dk + i)];
        k[at(t, i, dk)] = in.k[static_cast<size_t>((t * H + h) * dk + i)];
      }
      for (int64_t e = 0; e < dv; ++e)
        v[at(t, e, dv)] = in.v[static_cast<size_t>((t * H + h) * dv + e)];
      g[static_cast<size_t>(t)] = in.g[at(t, h, H)];
      beta[static_cast<size_t>(t)] = in.beta[at(t, h, H)];
    }
    Vec S(static_cast<size_t>(dk * dv), 0.0);
    for (int64_t c0 = 0; c0 < Tp; c0 += C) {
      Vec gc(static_cast<size_t>(C));
      double run = 0;
      for (int64_t i = 0; i < C; ++i)
        gc[static_cast<size_t>(i)] = run += g[static_cast<size_t>(c0 + i)];
      auto decay = [&](int64_t i, int64_t j) {
        return j <= i ? std::exp(gc[static_cast<size_t>(i)] - gc[static_cast<size_t>(j)]) : 0.0;
      };
      auto kk = [&](int64_t i, int64_t d) { return k[at(c0 + i, d, dk)]; };
      auto bt = [&](int64_t i) { return beta[static_cast<size_t>(c0 + i)]; };
      Vec A(static_cast<size_t>(C * C), 0.0);
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = 0; j < i; ++j) {
          double d = 0;
          for (int64_t e = 0; e < dk; ++e) d += kk(i, e) * bt(i) * kk(j, e);
          A[at(i, j, C)] = -d * decay(i, j);
        }
      for (int64_t i = 1; i < C; ++i) {
        const Vec row(A.begin() + i * C, A.begin() + i * C + i);
        for (int64_t j = 0; j < i; ++j) {
          double s = 0;
          for (int64_t m = 0; m < i; ++m) s += row[static_cast<size_t>(m)] * A[at(m, j, C)];
          A[at(i, j, C)] = row[static_cast<size_t>(j)] + s;
        }
      }
      for (int64_t i = 0; i < C; ++i) A[at(i, i, C)] += 1.0;
      Vec value(static_cast<size_t>(C * dv), 0.0), kcd(static_cast<size_t>(C * dk), 0.0);
      for (int64_t i = 0; i < C; ++i)
        for (int64_t j = 0; j < C; ++j) {
          const double a = A[at(i, j, C)];
          for (int64_t e = 0; e < dv; ++e) value[at(i, e, dv)] += a * v[at(c0 + j, e, dv)] * bt(j);
          for (int64_t e = 0; e < dk; ++e)
            kcd[at(i, e, dk)] += a * kk(j, e) * bt(j) * std::exp(gc[static_cast<size_t>(j)]);
        }
      Vec vnew(static_cast<size_t>(C * dv));
      for (int64_t i = 0; i < C; ++i)
        for (int64_t e = 0; e < dv; ++e) {
          double vp = 0;
          for (int64_t d = 0; d < dk; ++d) vp += kcd[at(i, d, dk)] * S[at(d, e, dv)];
          vnew[at(i, e, dv)] = value[at(i, e, dv)] - vp;
        }
      for (int64_t i = 0; i < C && c0 + i < T; ++i)
        for (int64_t e = 0; e < dv; ++e) {
          double o = 0;
          for (int64_t d = 0; d < dk; ++d)
            o += q[at(c0 + i, d, dk)] * std::exp(gc[static_cast<size_t>(i)]) * S[at(d, e, dv)];
          for (int64_t j = 0; j <= i; ++j) {
            double qk = 0;
            for (int64_t d = 0; d < dk; ++d) qk += q[at(c0 + i, d, dk)] * kk(j, d);
            o += qk * decay(i, j) * vnew[at(j, e, dv)];
          }
          out[static_cast<size_t>(((c0 + i) * H + h) * dv + e)] = o;
        }
      const double glast = gc[static_cast<size_t>(C - 1)];
      for (double& s : S) s *= std::exp(glast);
      for (int64_t i = 0; i < C; ++i) {
        const double w = std::exp(glast - gc[static_cast<size_t>(i)]);
        for (int64_t d = 0; d < dk; ++d)
          for (int64_t e = 0; e < dv; ++e) S[at(d, e, dv)] += kk(i, d) * w * vnew[at(i, e, dv)];
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Qwen3NextGatedDeltaNet.fix_query_key_value_ordering for one token: in_proj_qkvz's row is
// viewed [H_k, 2 dk + 2 dv H_v/H_k] and each key head's group split [dk | dk | r dv | r dv]
// (r = H_v / H_k) into q, k, v, z; in_proj_ba's row viewed [H_k, 2 r] and split [r | r] into
// b, a. v, z, b, a then read as H_v heads in (key head, r) order. Outputs flattened by head:
// q, k [H_k dk], v, z [H_v dv], b, a [H_v].
struct Qkvzba {
  Vec q, k, v, z, b, a;
};

inline Qkvzba fix_query_key_value_ordering(const double* qkvz, const double* ba, int64_t Hk,
                                           int64_t Hv, int64_t dk, int64_t dv) {
  const int64_t r = Hv / Hk, group = 2 * dk + 2 * r * dv;
  Qkvzba o;
  for (int64_t h = 0; h < Hk; ++h) {
    const double* g = qkvz + h * group;
    o.q.insert(o.q.end(), g, g + dk);
    o.k.insert(o.k.end(), g + dk, g + 2 * dk);
    o.v.insert(o.v.end(), g + 2 * dk, g + 2 * dk + r * dv);
    o.z.insert(o.z.end(), g + 2 * dk + r * dv, g + 2 * dk + 2 * r * dv);
    const double* gb = ba + h * 2 * r;
    o.b.insert(o.b.end(), gb, gb + r);
    o.a.insert(o.a.end(), gb + r, gb + 2 * r);
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// The forward. Deliberate faults (for the tests that show the comparison can fail) are off by
// default.
struct Faults {
  bool plain_qkvz_split = false;  // split in_proj_qkvz as [q all | k all | v all | z all]
  bool no_attn_gate = false;      // skip Qwen3NextAttention's sigmoid(gate)
};

class Reference {
 public:
  explicit Reference(const std::string& dir, Faults faults = {})
      : c_(read_config(dir)), w_(dir), faults_(faults) {}

  const Config& config() const { return c_; }

  // Qwen3NextForCausalLM.forward with no cache: logits of every position, [ids.size(), vocab].
  Vec logits(const std::vector<int32_t>& ids) const {
    const int64_t S = static_cast<int64_t>(ids.size()), D = c_.hidden_size;
    // Qwen3NextModel.forward: inputs_embeds = embed_tokens(input_ids).
    const Vec emb = w_.get("model.embed_tokens.weight");
    Vec x(static_cast<size_t>(S * D));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t d = 0; d < D; ++d) x[at(t, d, D)] = emb[at(ids[static_cast<size_t>(t)], d, D)];
    for (int64_t l = 0; l < c_.num_hidden_layers; ++l) {
      // Qwen3NextDecoderLayer.forward: pre-norm residual around the token mixer and the MLP.
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Vec h = rms_norm_1p(x, D, w_.get(p + "input_layernorm.weight"), c_.rms_norm_eps);
      const Vec m = c_.is_linear(l) ? gated_delta_net(h, S, p + "linear_attn.")
                                    : attention(h, S, p + "self_attn.");
      for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
      h = rms_norm_1p(x, D, w_.get(p + "post_attention_layernorm.weight"), c_.rms_norm_eps);
      const Vec f =
          c_.is_moe(l) ? sparse_moe(h, S, p + "mlp.") : mlp(h, S, p + "mlp.", c_.intermediate_size);
      for (size_t i = 0; i < x.size(); ++i) x[i] += f[i];
    }
    // Qwen3NextModel.forward: norm; Qwen3NextForCausalLM: lm_head (tied to embed_tokens when
    // tie_word_embeddings).
    const Vec h = rms_norm_1p(x, D, w_.get("model.norm.weight"), c_.rms_norm_eps);
    const std::string head = c_.tie_word_embeddings || !w_.has("lm_head.weight")
                                 ? "model.embed_tokens.weight"
                                 : "lm_head.weight";
    return linear(h, S, w_.get(head), c_.vocab_size);
  }

  // Greedy continuation: argmax of the reference's last-position logits, the sequence re-run
  // from scratch after each token (first maximum on ties, like torch.argmax).
  std::vector<int32_t> greedy(std::vector<int32_t> seq, int n) const {
    std::vector<int32_t> out;
    for (int i = 0; i < n; ++i) {
      const Vec l = logits(seq);
      const auto last = l.end() - c_.vocab_size;
      const auto id = static_cast<int32_t>(std::max_element(last, l.end()) - last);
      out.push_back(id);
      seq.push_back(id);
    }
    return out;
  }

 private:
  Vec lin(const Vec& x, int64_t S, const std::string& name, const std::string& bias = "") const {
    return linear(x, S, w_.get(name), w_.rows(name), bias.empty() ? Vec() : w_.get(bias));
  }

  // Qwen3NextAttention.forward (eager_attention_forward, causal mask).
  Vec attention(const Vec& h, int64_t S, const std::string& p) const {
    const int64_t H = c_.num_attention_heads, Hkv = c_.num_key_value_heads, Dh = c_.head_dim;
    const bool b = c_.attention_bias;
    // q_proj(...).view(*input_shape, -1, head_dim * 2), chunk(2): per head [query | gate].
    const Vec qg = lin(h, S, p + "q_proj.weight", b ? p + "q_proj.bias" : "");
    Vec q(static_cast<size_t>(S * H * Dh)), gate(q.size());
    for (int64_t t = 0; t < S; ++t)
      for (int64_t hh = 0; hh < H; ++hh)
        for (int64_t e = 0; e < Dh; ++e) {
          q[at(t, hh * Dh + e, H * Dh)] = qg[at(t, hh * 2 * Dh + e, H * 2 * Dh)];
          gate[at(t, hh * Dh + e, H * Dh)] = qg[at(t, hh * 2 * Dh + Dh + e, H * 2 * Dh)];
        }
    // q_norm / k_norm: Qwen3NextRMSNorm over head_dim.
    q = rms_norm_1p(q, Dh, w_.get(p + "q_norm.weight"), c_.rms_norm_eps);
    Vec k = rms_norm_1p(lin(h, S, p + "k_proj.weight", b ? p + "k_proj.bias" : ""), Dh,
                        w_.get(p + "k_norm.weight"), c_.rms_norm_eps);
    const Vec v = lin(h, S, p + "v_proj.weight", b ? p + "v_proj.bias" : "");
    // apply_rotary_pos_emb: rotate_half RoPE on the first rotary_dim dims, the rest passed.
    const int64_t R = c_.rotary_dim();
    auto rope = [&](double* x, int64_t t) {
      for (int64_t i = 0; i < R / 2; ++i) {
        const double inv =
            1.0 / std::pow(c_.rope_theta, static_cast<double>(2 * i) / static_cast<double>(R));
        const double cs = std::cos(static_cast<double>(t) * inv),
                     sn = std::sin(static_cast<double>(t) * inv);
        const double a = x[i], bb = x[i + R / 2];
        x[i] = a * cs - bb * sn;
        x[i + R / 2] = bb * cs + a * sn;
      }
    };
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t hh = 0; hh < H; ++hh) rope(&q[at(t, hh * Dh, H * Dh)], t);
      for (int64_t hh = 0; hh < Hkv; ++hh) rope(&k[at(t, hh * Dh, Hkv * Dh)], t);
    }
    // softmax(q k^T * head_dim^-0.5 + causal mask) v, repeat_kv: head hh reads kv head
    // hh / (H / Hkv).
    const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
    Vec att(static_cast<size_t>(S * H * Dh), 0.0);
    for (int64_t hh = 0; hh < H; ++hh) {
      const int64_t kv = hh / (H / Hkv);
      for (int64_t t = 0; t < S; ++t) {
        Vec s(static_cast<size_t>(t + 1));
        double mx = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int64_t e = 0; e < Dh; ++e)
            d += q[at(t, hh * Dh + e, H * Dh)] * k[at(j, kv * Dh + e, Hkv * Dh)];
          s[static_cast<size_t>(j)] = d * scale;
          mx = std::max(mx, d * scale);
        }
        double den = 0;
        for (double& x : s) den += (x = std::exp(x - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t e = 0; e < Dh; ++e)
            att[at(t, hh * Dh + e, H * Dh)] +=
                s[static_cast<size_t>(j)] / den * v[at(j, kv * Dh + e, Hkv * Dh)];
      }
    }
    // attn_output * sigmoid(gate), then o_proj.
    if (!faults_.no_attn_gate)
      for (size_t i = 0; i < att.size(); ++i) att[i] *= sigmoid(gate[i]);
    return lin(att, S, p + "o_proj.weight", b ? p + "o_proj.bias" : "");
  }

  // Qwen3NextGatedDeltaNet.forward with no cache (the chunk rule's path; the recurrent rule is
  // the same function of the inputs, see the self-check test).
  Vec gated_delta_net(const Vec& h, int64_t S, const std::string& p) const {
    const int64_t Hk = c_.linear_num_key_heads, Hv = c_.linear_num_value_heads;
    const int64_t dk = c_.linear_key_head_dim, dv = c_.linear_value_head_dim;
    const int64_t Kd = Hk * dk, Vd = Hv * dv, C = 2 * Kd + Vd, K = c_.linear_conv_kernel_dim;
    const int64_t r = Hv / Hk;
    const Vec qkvz = lin(h, S, p + "in_proj_qkvz.weight"), ba = lin(h, S, p + "in_proj_ba.weight");
    // fix_query_key_value_ordering, then mixed_qkv = cat(query, key, value) flattened.
    Vec mixed(static_cast<size_t>(S * C)), z(static_cast<size_t>(S * Vd));
    Vec b(static_cast<size_t>(S * Hv)), a(b.size());
    for (int64_t t = 0; t < S; ++t) {
      Qkvzba o;
      const double* row = &qkvz[at(t, 0, 2 * Kd + 2 * Vd)];
      if (faults_.plain_qkvz_split) {
        o.q.assign(row, row + Kd);
        o.k.assign(row + Kd, row + 2 * Kd);
        o.v.assign(row + 2 * Kd, row + 2 * Kd + Vd);
        o.z.assign(row + 2 * Kd + Vd, row + 2 * Kd + 2 * Vd);
        o.b.assign(&ba[at(t, 0, 2 * Hv)], &ba[at(t, Hv, 2 * Hv)]);
        o.a.assign(&ba[at(t, Hv, 2 * Hv)], &ba[at(t, 0, 2 * Hv)] + 2 * Hv);
      } else {
        o = fix_query_key_value_ordering(row, &ba[at(t, 0, 2 * Hv)], Hk, Hv, dk, dv);
      }
      std::copy(o.q.begin(), o.q.end(), mixed.begin() + t * C);
      std::copy(o.k.begin(), o.k.end(), mixed.begin() + t * C + Kd);
      std::copy(o.v.begin(), o.v.end(), mixed.begin() + t * C + 2 * Kd);
      std::copy(o.z.begin(), o.z.end(), z.begin() + t * Vd);
      std::copy(o.b.begin(), o.b.end(), b.begin() + t * Hv);
      std::copy(o.a.begin(), o.a.end(), a.begin() + t * Hv);
    }
    // self.conv1d (depthwise, kernel K, padding K-1, no bias) [:, :, :seq_len], then F.silu:
    // out[t][c] = sum_j w[c][0][j] * x[t - (K-1) + j][c], zero before the sequence.
    const Vec cw = w_.get(p + "conv1d.weight");  // [C, 1, K]
    Vec conv(mixed.size());
    for (int64_t t = 0; t < S; ++t)
      for (int64_t ch = 0; ch < C; ++ch) {
        double acc = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t src = t - (K - 1) + j;
          if (src >= 0) acc += cw[at(ch, j, K)] * mixed[at(src, ch, C)];
        }
        conv[at(t, ch, C)] = silu(acc);
      }
    // split [key_dim, key_dim, value_dim]; beta = sigmoid(b);
    // g = -exp(A_log) * softplus(a + dt_bias); q, k repeat_interleave(H_v / H_k, dim=2).
    const Vec A_log = w_.get(p + "A_log"), dt_bias = w_.get(p + "dt_bias");
    DeltaInputs in;
    in.T = S;
    in.H = Hv;
    in.dk = dk;
    in.dv = dv;
    in.q.resize(static_cast<size_t>(S * Hv * dk));
    in.k.resize(in.q.size());
    in.v.resize(static_cast<size_t>(S * Hv * dv));
    in.g.resize(static_cast<size_t>(S * Hv));
    in.beta.resize(in.g.size());
    for (int64_t t = 0; t < S; ++t)
      for (int64_t hv = 0; hv < Hv; ++hv) {
        const int64_t hk = hv / r;
        for (int64_t i = 0; i < dk; ++i) {
          in.q[static_cast<size_t>((t * Hv + hv) * dk + i)] = conv[at(t, hk * dk + i, C)];
          in.k[static_cast<size_t>((t * Hv + hv) * dk + i)] = conv[at(t, Kd + hk * dk + i, C)];
        }
        for (int64_t e = 0; e < dv; ++e)
          in.v[static_cast<size_t>((t * Hv + hv) * dv + e)] = conv[at(t, 2 * Kd + hv * dv + e, C)];
        in.beta[at(t, hv, Hv)] = sigmoid(b[at(t, hv, Hv)]);
        in.g[at(t, hv, Hv)] = -std::exp(A_log[static_cast<size_t>(hv)]) *
                              softplus(a[at(t, hv, Hv)] + dt_bias[static_cast<size_t>(hv)]);
      }
    // chunk_gated_delta_rule(..., use_qk_l2norm_in_kernel=True); the recurrent form is used
    // here (equal in exact arithmetic; the self-check holds them to 1e-10).
    const Vec core = recurrent_gated_delta_rule(in);
    // self.norm(core_attn_out, z): Qwen3NextRMSNormGated per (token, value head); out_proj.
    const Vec normed = rms_norm_gated(core, z, dv, w_.get(p + "norm.weight"), c_.rms_norm_eps);
    return lin(normed, S, p + "out_proj.weight");
  }

  // Qwen3NextMLP: down_proj(silu(gate_proj(x)) * up_proj(x)).
  Vec mlp(const Vec& h, int64_t S, const std::string& p, int64_t I) const {
    Vec g = lin(h, S, p + "gate_proj.weight");
    const Vec u = lin(h, S, p + "up_proj.weight");
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
    (void)I;
    return lin(g, S, p + "down_proj.weight");
  }

  // Qwen3NextSparseMoeBlock.forward: Qwen3NextTopKRouter (softmax over num_experts in float,
  // torch.topk, / sum when norm_topk_prob), Qwen3NextExperts (silu(gate) * up, down) weighted,
  // plus sigmoid(shared_expert_gate(x)) * shared_expert(x). Experts as the published checkpoint
  // stores them (mlp.experts.<e>.{gate,up,down}_proj.weight) or fused as transformers v5 holds
  // them (mlp.experts.gate_up_proj [E, 2I, D], mlp.experts.down_proj [E, D, I]).
  Vec sparse_moe(const Vec& h, int64_t S, const std::string& p) const {
    const int64_t D = c_.hidden_size, E = c_.num_experts, K = c_.num_experts_per_tok;
    const int64_t I = c_.moe_intermediate_size;
    const Vec router = lin(h, S, p + "gate.weight");
    Vec out = mlp(h, S, p + "shared_expert.", c_.shared_expert_intermediate_size);
    const Vec sg = lin(h, S, p + "shared_expert_gate.weight");
    for (int64_t t = 0; t < S; ++t)
      for (int64_t d = 0; d < D; ++d) out[at(t, d, D)] *= sigmoid(sg[static_cast<size_t>(t)]);
    const bool fused = w_.has(p + "experts.gate_up_proj");
    const Vec gu = fused ? w_.get(p + "experts.gate_up_proj") : Vec();
    const Vec dn = fused ? w_.get(p + "experts.down_proj") : Vec();
    for (int64_t t = 0; t < S; ++t) {
      Vec prob(static_cast<size_t>(E));
      double mx = -INFINITY, den = 0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, router[at(t, e, E)]);
      for (int64_t e = 0; e < E; ++e)
        den += prob[static_cast<size_t>(e)] = std::exp(router[at(t, e, E)] - mx);
      for (double& x : prob) x /= den;
      std::vector<int64_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
        return prob[static_cast<size_t>(x)] > prob[static_cast<size_t>(y)];
      });
      double sum = 0;
      for (int64_t i = 0; i < K; ++i)
        sum += prob[static_cast<size_t>(order[static_cast<size_t>(i)])];
      const Vec ht(h.begin() + t * D, h.begin() + (t + 1) * D);
      for (int64_t i = 0; i < K; ++i) {
        const int64_t e = order[static_cast<size_t>(i)];
        double wgt = prob[static_cast<size_t>(e)];
        if (c_.norm_topk_prob) wgt /= sum;
        Vec y;
        if (fused) {
          Vec act(static_cast<size_t>(I));
          for (int64_t j = 0; j < I; ++j) {
            double g = 0, u = 0;
            for (int64_t d = 0; d < D; ++d) {
              g += gu[static_cast<size_t>((e * 2 * I + j) * D + d)] * ht[static_cast<size_t>(d)];
              u +=
                  gu[static_cast<size_t>((e * 2 * I + I + j) * D + d)] * ht[static_cast<size_t>(d)];
            }
            act[static_cast<size_t>(j)] = silu(g) * u;
          }
          y.assign(static_cast<size_t>(D), 0.0);
          for (int64_t d = 0; d < D; ++d)
            for (int64_t j = 0; j < I; ++j)
              y[static_cast<size_t>(d)] +=
                  dn[static_cast<size_t>((e * D + d) * I + j)] * act[static_cast<size_t>(j)];
        } else {
          y = mlp(ht, 1, p + "experts." + std::to_string(e) + ".", I);
        }
        for (int64_t d = 0; d < D; ++d) out[at(t, d, D)] += wgt * y[static_cast<size_t>(d)];
      }
    }
    return out;
  }

  Config c_;
  Weights w_;
  Faults faults_;
};

// ---------------------------------------------------------------------------------------------
// A tiny Qwen3-Next folder: config.json as the published checkpoints write it (model_type
// qwen3_next, full_attention_interval or layer_types, partial_rotary_factor and rope_theta at
// the top level) and model.safetensors with the checkpoint's tensor names (experts one by one,
// no mtp.*), seeded random weights scaled like a trained model's (std ~ 1/sqrt(fan_in)).
struct TinySpec {
  int64_t vocab = 97, hidden = 40, layers = 5, intermediate = 24;
  int64_t heads = 3, kv_heads = 1, head_dim = 12;
  double partial_rotary_factor = 0.5, rope_theta = 10000.0, rms_norm_eps = 1e-6;
  int64_t full_attention_interval = 2;
  std::vector<std::string> layer_types;  // empty: from full_attention_interval
  int64_t lin_k_heads = 2, lin_v_heads = 4, lin_dk = 8, lin_dv = 6, conv_kernel = 4;
  int64_t experts = 4, top_k = 2, moe_intermediate = 10, shared_intermediate = 14;
  std::vector<int64_t> mlp_only_layers = {0};
  int64_t decoder_sparse_step = 1;
  bool norm_topk_prob = true, tied = false;
  int64_t max_positions = 256;
  // The published checkpoints also carry the multi-token-prediction head (mtp.*), which
  // transformers skips (_keys_to_ignore_on_load_unexpected = [r"^mtp.*"]).
  bool mtp_tensors = false;
  uint64_t seed = 7;
  DType dtype = DType::kF32;  // of the matrices (vectors stay f32)
};

inline void write_tiny_folder(const std::string& dir, const TinySpec& s) {
  std::filesystem::create_directories(dir);
  nlohmann::json j = {
      {"architectures", nlohmann::json::array({"Qwen3NextForCausalLM"})},
      {"model_type", "qwen3_next"},
      {"vocab_size", s.vocab},
      {"hidden_size", s.hidden},
      {"intermediate_size", s.intermediate},
      {"num_hidden_layers", s.layers},
      {"num_attention_heads", s.heads},
      {"num_key_value_heads", s.kv_heads},
      {"head_dim", s.head_dim},
      {"hidden_act", "silu"},
      {"max_position_embeddings", s.max_positions},
      {"rms_norm_eps", s.rms_norm_eps},
      {"rope_theta", s.rope_theta},
      {"partial_rotary_factor", s.partial_rotary_factor},
      {"rope_scaling", nullptr},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"linear_conv_kernel_dim", s.conv_kernel},
      {"linear_key_head_dim", s.lin_dk},
      {"linear_value_head_dim", s.lin_dv},
      {"linear_num_key_heads", s.lin_k_heads},
      {"linear_num_value_heads", s.lin_v_heads},
      {"decoder_sparse_step", s.decoder_sparse_step},
      {"moe_intermediate_size", s.moe_intermediate},
      {"shared_expert_intermediate_size", s.shared_intermediate},
      {"num_experts_per_tok", s.top_k},
      {"num_experts", s.experts},
      {"norm_topk_prob", s.norm_topk_prob},
      {"mlp_only_layers", s.mlp_only_layers},
      {"tie_word_embeddings", s.tied},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"torch_dtype", s.dtype == DType::kBF16 ? "bfloat16" : "float32"},
  };
  if (s.layer_types.empty())
    j["full_attention_interval"] = s.full_attention_interval;
  else
    j["layer_types"] = s.layer_types;
  std::ofstream(dir + "/config.json") << j.dump(2);

  const Config c = parse_config(j);
  std::mt19937_64 rng(s.seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<Tensor> store;
  std::vector<std::pair<std::string, TensorView>> named;
  store.reserve(1024);
  auto put = [&](const std::string& name, const Shape& shape, DType dt,
                 const std::function<double()>& draw) {
    Tensor f = Tensor::empty(DType::kF32, shape);
    for (int64_t i = 0; i < f.numel(); ++i) f.data_as<float>()[i] = static_cast<float>(draw());
    Tensor out = Tensor::empty(dt, shape);
    convert_n(f.data(), DType::kF32, out.data(), dt, static_cast<size_t>(f.numel()));
    store.push_back(std::move(out));
    named.emplace_back(name, store.back().view());
  };
  auto matrix = [&](const std::string& name, int64_t out, int64_t in) {
    const double sd = 1.0 / std::sqrt(static_cast<double>(in));
    put(name, {out, in}, s.dtype, [&] { return sd * normal(rng); });
  };
  auto vector_of = [&](const std::string& name, int64_t n, double mean, double sd) {
    put(name, {n}, DType::kF32, [&] { return mean + sd * normal(rng); });
  };
  const int64_t D = s.hidden;
  matrix("model.embed_tokens.weight", s.vocab, D);
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    vector_of(p + "input_layernorm.weight", D, 0.0, 0.1);  // zero-centred: (1 + w)
    vector_of(p + "post_attention_layernorm.weight", D, 0.0, 0.1);
    if (c.is_linear(l)) {
      const std::string q = p + "linear_attn.";
      const int64_t Kd = s.lin_k_heads * s.lin_dk, Vd = s.lin_v_heads * s.lin_dv;
      matrix(q + "in_proj_qkvz.weight", 2 * Kd + 2 * Vd, D);
      matrix(q + "in_proj_ba.weight", 2 * s.lin_v_heads, D);
      put(q + "conv1d.weight", {2 * Kd + Vd, 1, s.conv_kernel}, DType::kF32,
          [&] { return 0.5 * normal(rng); });
      vector_of(q + "dt_bias", s.lin_v_heads, 1.0, 0.2);
      // A_log = log(A), A ~ U(0, 16) in _init_weights; U(0.5, 4) keeps the decay moderate.
      put(q + "A_log", {s.lin_v_heads}, DType::kF32,
          [&] { return std::log(0.5 + 3.5 * uniform(rng)); });
      vector_of(q + "norm.weight", s.lin_dv, 1.0, 0.1);  // plain weight (ones at init)
      matrix(q + "out_proj.weight", D, Vd);
    } else {
      const std::string q = p + "self_attn.";
      matrix(q + "q_proj.weight", s.heads * s.head_dim * 2, D);
      matrix(q + "k_proj.weight", s.kv_heads * s.head_dim, D);
      matrix(q + "v_proj.weight", s.kv_heads * s.head_dim, D);
      matrix(q + "o_proj.weight", D, s.heads * s.head_dim);
      vector_of(q + "q_norm.weight", s.head_dim, 0.0, 0.1);
      vector_of(q + "k_norm.weight", s.head_dim, 0.0, 0.1);
    }
    const std::string m = p + "mlp.";
    auto dense = [&](const std::string& q, int64_t I) {
      matrix(q + "gate_proj.weight", I, D);
      matrix(q + "up_proj.weight", I, D);
      matrix(q + "down_proj.weight", D, I);
    };
    if (c.is_moe(l)) {
      matrix(m + "gate.weight", s.experts, D);
      for (int64_t e = 0; e < s.experts; ++e)
        dense(m + "experts." + std::to_string(e) + ".", s.moe_intermediate);
      dense(m + "shared_expert.", s.shared_intermediate);
      matrix(m + "shared_expert_gate.weight", 1, D);
    } else {
      dense(m, s.intermediate);
    }
  }
  vector_of("model.norm.weight", D, 0.0, 0.1);
  if (!s.tied) matrix("lm_head.weight", s.vocab, D);
  if (s.mtp_tensors) {
    matrix("mtp.fc.weight", D, 2 * D);
    vector_of("mtp.pre_fc_norm_embedding.weight", D, 0.0, 0.1);
    vector_of("mtp.pre_fc_norm_hidden.weight", D, 0.0, 0.1);
    vector_of("mtp.norm.weight", D, 0.0, 0.1);
  }
  write_safetensors(dir + "/model.safetensors", named, {{"format", "pt"}});
}

}  // namespace kvcache::testing_util::q3n
