// A deliberately plain no-cache forward for the non-llama families, written from the
// transformers modeling files (cited per step) and sharing no code with src/model:
// double-free float loops over std::vector, every weight read by its Hugging Face name. The
// tests hold the engine's forward (every container, every kernel) against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/model_file.h"

namespace kvcache::testing_util {

class FamilyReference {
 public:
  explicit FamilyReference(const ModelFile& f) : f_(f), c_(f.config()) {}

  // Logits of every position, [ids.size(), vocab].
  std::vector<float> logits(const std::vector<int32_t>& ids) const {
    theta_ = c_.rope_theta;
    if (c_.gemma3n.enabled()) return gemma3n(ids);
    const int64_t S = static_cast<int64_t>(ids.size()), dim = c_.dim;
    const std::vector<float> emb = get("model.embed_tokens.weight");
    std::vector<float> x(static_cast<size_t>(S * dim));
    const bool gemma = gemma_block();
    // Gemma2Model.forward: hidden_states * hidden_size ** 0.5 (Gemma3TextScaledWordEmbedding
    // the same).
    const float scale = gemma ? static_cast<float>(std::sqrt(static_cast<double>(dim))) : 1.0f;
    for (int64_t t = 0; t < S; ++t)
      for (int64_t d = 0; d < dim; ++d)
        x[idx(t, d, dim)] = emb[idx(ids[static_cast<size_t>(t)], d, dim)] * scale;
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      std::vector<float> h = norm(x, S, dim, p + "input_layernorm.weight", c_.rms_eps);
      std::vector<float> a = c_.mla.enabled() ? mla(h, S, l, p) : gqa(h, S, l, p);
      if (gemma) a = norm(a, S, dim, p + "post_attention_layernorm.weight", c_.rms_eps);
      for (size_t i = 0; i < x.size(); ++i) x[i] += a[i];
      h = norm(x, S, dim,
               p + (gemma ? "pre_feedforward_layernorm.weight" : "post_attention_layernorm.weight"),
               c_.rms_eps);
      std::vector<float> m = c_.architecture == "phi3" ? phi3_mlp(h, S, p)
                             : c_.moe.is_moe_layer(l)  ? moe(h, S, p)
                                                       : mlp(h, S, p + "mlp.", c_.hidden_dim);
      if (gemma) m = norm(m, S, dim, p + "post_feedforward_layernorm.weight", c_.rms_eps);
      for (size_t i = 0; i < x.size(); ++i) x[i] += m[i];
    }
    const std::vector<float> h = norm(x, S, dim, "model.norm.weight", c_.rms_eps);
    std::vector<float> out =
        linear(h, S, c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    if (c_.final_softcap > 0) {
      for (float& v : out) v = std::tanh(v / c_.final_softcap) * c_.final_softcap;
    }
    return out;
  }

 private:
  static size_t idx(int64_t r, int64_t c, int64_t ld) { return static_cast<size_t>(r * ld + c); }

  // Gemma2RMSNorm / Gemma3RMSNorm scale by (1 + w); the sandwich norms and embedding scale too.
  bool gemma_block() const { return c_.architecture == "gemma2" || c_.architecture == "gemma3"; }

  // Columns [from, from + n) of a [S, ld] matrix.
  static std::vector<float> columns(const std::vector<float>& x, int64_t S, int64_t ld,
                                    int64_t from, int64_t n) {
    std::vector<float> y(static_cast<size_t>(S * n));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < n; ++i) y[idx(t, i, n)] = x[idx(t, from + i, ld)];
    return y;
  }

  // Phi3MLP.forward: gate, up = gate_up_proj(x).chunk(2, dim=-1); down(up * silu(gate)).
  std::vector<float> phi3_mlp(const std::vector<float>& h, int64_t S, const std::string& p) const {
    const int64_t I = c_.hidden_dim;
    const std::vector<float> gu = linear(h, S, p + "mlp.gate_up_proj.weight");
    std::vector<float> a(static_cast<size_t>(S * I));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t i = 0; i < I; ++i) {
        const double g = gu[idx(t, i, 2 * I)], u = gu[idx(t, I + i, 2 * I)];
        a[idx(t, i, I)] = static_cast<float>(u * (g / (1.0 + std::exp(-g))));
      }
    return linear(a, S, p + "mlp.down_proj.weight");
  }

  std::vector<float> get(const std::string& name) const {
    const TensorView& t = f_.tensor(name);
    std::vector<float> v(static_cast<size_t>(t.numel()));
    convert_n(t.data(), t.dtype(), v.data(), DType::kF32, v.size());
    return v;
  }
  int64_t rows_of(const std::string& name) const { return f_.tensor(name).dim(0); }

  // y[S, out] = x[S, in] W^T (+ bias), W = [out, in] (nn.Linear).
  std::vector<float> linear(const std::vector<float>& x, int64_t S, const std::string& w_name,
                            const std::string& b_name = "") const {
    const std::vector<float> w = get(w_name);
    const int64_t out = rows_of(w_name), in = static_cast<int64_t>(w.size()) / out;
    const std::vector<float> b = b_name.empty() ? std::vector<float>() : get(b_name);
    std::vector<float> y(static_cast<size_t>(S * out));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = b.empty() ? 0.0 : b[static_cast<size_t>(o)];
        for (int64_t i = 0; i < in; ++i)
          acc += static_cast<double>(w[idx(o, i, in)]) * x[idx(t, i, in)];
        y[idx(t, o, out)] = static_cast<float>(acc);
      }
    return y;
  }

  // RMSNorm rows of x ([S, n] with row stride ld, from column off): Gemma's (1 + w) variant.
  std::vector<float> norm(const std::vector<float>& x, int64_t S, int64_t n,
                          const std::string& w_name, float eps, int64_t ld = 0, int64_t off = 0,
                          bool gemma_form = true) const {
    if (ld == 0) ld = n;
    const std::vector<float> w =
        w_name.empty() ? std::vector<float>(static_cast<size_t>(n), 1.0f) : get(w_name);
    const bool plus_one = gemma_form && gemma_block();
    std::vector<float> y(static_cast<size_t>(S * n));
    for (int64_t t = 0; t < S; ++t) {
      double ss = 0;
      for (int64_t i = 0; i < n; ++i)
        ss += static_cast<double>(x[idx(t, off + i, ld)]) * x[idx(t, off + i, ld)];
      const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
      for (int64_t i = 0; i < n; ++i) {
        const double wi = plus_one ? 1.0 + w[static_cast<size_t>(i)] : w[static_cast<size_t>(i)];
        y[idx(t, i, n)] = static_cast<float>(x[idx(t, off + i, ld)] * r * wi);
      }
    }
    return y;
  }

  // cos/sin of position t for pair i of a rot_dim-wide rotary part (HF inv_freq with the
  // config's per-pair divisors, times yarn's attention factor).
  void cos_sin(int64_t t, int64_t i, int64_t rot_dim, double* cs, double* sn) const {
    double inv = 1.0 / std::pow(static_cast<double>(theta_),
                                2.0 * static_cast<double>(i) / static_cast<double>(rot_dim));
    // Gemma-3's sliding layers rotate with default RoPE on their own theta (rotary_emb_local).
    if (!c_.rope_freq_factors.empty() && !local_rope_)
      inv /= c_.rope_freq_factors[static_cast<size_t>(i)];
    const double ang = static_cast<double>(t) * inv;
    *cs = std::cos(ang) * c_.rope_attention_factor;
    *sn = std::sin(ang) * c_.rope_attention_factor;
  }
  // rotate_half convention on v[0, d): pairs (i, i + d/2).
  void rope_half(float* v, int64_t t, int64_t d) const {
    for (int64_t i = 0; i < d / 2; ++i) {
      double cs, sn;
      cos_sin(t, i, d, &cs, &sn);
      const double a = v[i], b = v[i + d / 2];
      v[i] = static_cast<float>(a * cs - b * sn);
      v[i + d / 2] = static_cast<float>(b * cs + a * sn);
    }
  }
  // DeepSeek-V3 apply_rotary_pos_emb_interleave: view (d/2, 2) -> transpose -> rotate_half.
  void rope_deepseek(float* v, int64_t t, int64_t d) const {
    std::vector<float> perm(static_cast<size_t>(d));
    for (int64_t i = 0; i < d / 2; ++i) {
      perm[static_cast<size_t>(i)] = v[2 * i];
      perm[static_cast<size_t>(i + d / 2)] = v[2 * i + 1];
    }
    rope_half(perm.data(), t, d);
    std::copy(perm.begin(), perm.end(), v);  // stays in the permuted order, like transformers
  }

  bool visible(int64_t l, int64_t t, int64_t j) const {
    if (j > t) return false;
    const std::string& type = c_.layer_types[static_cast<size_t>(l)];
    if (type == "sliding_attention") return j > t - c_.sliding_window;  // sliding_window_overlay
    if (type == "chunked_attention")
      return j / c_.attention_chunk_size == t / c_.attention_chunk_size;
    return true;
  }

  // softmax over visible keys (+ sink column dropped after), softcap before, per (t, head).
  void attend(int64_t l, int64_t S, int64_t H, int64_t Hkv, int64_t Dk, int64_t Dv,
              const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
              const std::vector<float>& sinks, double scale, std::vector<float>& out) const {
    out.assign(static_cast<size_t>(S * H * Dv), 0.0f);
    std::vector<double> s(static_cast<size_t>(S));
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / Hkv);
      for (int64_t t = 0; t < S; ++t) {
        double mx = sinks.empty() ? -INFINITY : sinks[static_cast<size_t>(h)];
        for (int64_t j = 0; j <= t; ++j) {
          if (!visible(l, t, j)) continue;
          double d = 0;
          for (int64_t e = 0; e < Dk; ++e)
            d += static_cast<double>(q[idx(t, h * Dk + e, H * Dk)]) *
                 k[idx(j, hk * Dk + e, Hkv * Dk)];
          d *= scale;
          if (c_.attn_softcap > 0) d = c_.attn_softcap * std::tanh(d / c_.attn_softcap);
          s[static_cast<size_t>(j)] = d;
          mx = std::max(mx, d);
        }
        double den = sinks.empty() ? 0.0 : std::exp(sinks[static_cast<size_t>(h)] - mx);
        for (int64_t j = 0; j <= t; ++j)
          if (visible(l, t, j)) den += std::exp(s[static_cast<size_t>(j)] - mx);
        for (int64_t j = 0; j <= t; ++j) {
          if (!visible(l, t, j)) continue;
          const double p = std::exp(s[static_cast<size_t>(j)] - mx) / den;
          for (int64_t e = 0; e < Dv; ++e)
            out[idx(t, h * Dv + e, H * Dv)] +=
                static_cast<float>(p * v[idx(j, hk * Dv + e, Hkv * Dv)]);
        }
      }
    }
  }

  std::vector<float> gqa(const std::vector<float>& h, int64_t S, int64_t l,
                         const std::string& p) const {
    const int64_t H = c_.n_heads, Hkv = c_.n_kv_heads, D = c_.head_dim;
    const bool b = c_.qkv_bias;
    // Gemma-3n: sliding layers rotate with rope_local_base_freq.
    local_rope_ =
        c_.rope_local_theta > 0 && c_.layer_types[static_cast<size_t>(l)] == "sliding_attention";
    theta_ = local_rope_ ? c_.rope_local_theta : c_.rope_theta;
    std::vector<float> q, k, v;
    if (c_.architecture == "phi3") {
      // Phi3Attention.forward: qkv_proj, then columns [q | k | v].
      const std::vector<float> qkv = linear(h, S, p + "self_attn.qkv_proj.weight");
      const int64_t ld = (H + 2 * Hkv) * D;
      q = columns(qkv, S, ld, 0, H * D);
      k = columns(qkv, S, ld, H * D, Hkv * D);
      v = columns(qkv, S, ld, (H + Hkv) * D, Hkv * D);
    } else {
      q = linear(h, S, p + "self_attn.q_proj.weight", b ? p + "self_attn.q_proj.bias" : "");
      k = linear(h, S, p + "self_attn.k_proj.weight", b ? p + "self_attn.k_proj.bias" : "");
      v = linear(h, S, p + "self_attn.v_proj.weight", b ? p + "self_attn.v_proj.bias" : "");
    }
    if (c_.qkv_norm) {  // Gemma3nTextAttention: q_norm, k_norm, v_norm (no scale) per head
      q = norm(q, S * H, D, p + "self_attn.q_norm.weight", c_.rms_eps);
      k = norm(k, S * Hkv, D, p + "self_attn.k_norm.weight", c_.rms_eps);
      v = norm(v, S * Hkv, D, "", c_.rms_eps);
    } else if (c_.qk_norm) {
      // Qwen3Attention (w) / Gemma3Attention ((1 + w)): q_norm, k_norm per head, before RoPE.
      q = norm(q, S * H, D, p + "self_attn.q_norm.weight", c_.rms_eps);
      k = norm(k, S * Hkv, D, p + "self_attn.k_norm.weight", c_.rms_eps);
    }
    // Phi3's apply_rotary_pos_emb: rotate_half on the first int(D * partial_rotary_factor) dims.
    const int64_t rot = static_cast<int64_t>(static_cast<double>(D) * c_.partial_rotary_factor);
    for (int64_t t = 0; t < S; ++t) {
      for (int64_t hh = 0; hh < H; ++hh) rope_half(&q[idx(t, hh * D, H * D)], t, rot);
      for (int64_t hh = 0; hh < Hkv; ++hh) rope_half(&k[idx(t, hh * D, Hkv * D)], t, rot);
    }
    // KV sharing (Gemma3nTextAttention): the last num_kv_shared_layers layers use the K/V of
    // the last earlier non-shared layer of their type instead of their own.
    const int64_t first_shared = c_.n_layers - c_.num_kv_shared_layers;
    if (l >= first_shared) {
      int64_t src = first_shared - 1;
      while (c_.layer_types[static_cast<size_t>(src)] != c_.layer_types[static_cast<size_t>(l)])
        --src;
      k = kept_k_[static_cast<size_t>(src)];
      v = kept_v_[static_cast<size_t>(src)];
    } else {
      kept_k_.resize(static_cast<size_t>(c_.n_layers));
      kept_v_.resize(static_cast<size_t>(c_.n_layers));
      kept_k_[static_cast<size_t>(l)] = k;
      kept_v_[static_cast<size_t>(l)] = v;
    }
    // Gemma2Attention: query_pre_attn_scalar ** -0.5; others head_dim ** -0.5.
    const double scale =
        c_.query_scale > 0 ? c_.query_scale : 1.0 / std::sqrt(static_cast<double>(D));
    std::vector<float> att;
    attend(l, S, H, Hkv, D, D, q, k, v,
           c_.attn_sinks ? get(p + "self_attn.sinks") : std::vector<float>(), scale, att);
    return linear(att, S, p + "self_attn.o_proj.weight",
                  c_.attn_out_bias ? p + "self_attn.o_proj.bias" : "");
  }

  // DeepseekV3Attention.forward with the per-head K/V expanded from the latent.
  std::vector<float> mla(const std::vector<float>& h, int64_t S, int64_t l,
                         const std::string& p) const {
    const MlaConfig& m = c_.mla;
    const int64_t H = c_.n_heads, dn = m.qk_nope_head_dim, dr = m.qk_rope_head_dim,
                  dv = m.v_head_dim, dc = m.kv_lora_rank;
    const int64_t dqk = dn + dr;
    std::vector<float> q;
    if (m.q_lora_rank > 0) {
      const std::vector<float> qa = linear(h, S, p + "self_attn.q_a_proj.weight");
      q = linear(
          norm(qa, S, m.q_lora_rank, p + "self_attn.q_a_layernorm.weight", 1e-6f, 0, 0, false), S,
          p + "self_attn.q_b_proj.weight");
    } else {
      q = linear(h, S, p + "self_attn.q_proj.weight");
    }
    const std::vector<float> ckv = linear(h, S, p + "self_attn.kv_a_proj_with_mqa.weight");
    const std::vector<float> lat =
        norm(ckv, S, dc, p + "self_attn.kv_a_layernorm.weight", 1e-6f, dc + dr, 0, false);
    const std::vector<float> kvb =
        linear(lat, S, p + "self_attn.kv_b_proj.weight");  // [S, H*(dn+dv)]
    std::vector<float> K(static_cast<size_t>(S * H * dqk)), V(static_cast<size_t>(S * H * dv));
    for (int64_t t = 0; t < S; ++t) {
      std::vector<float> kr(ckv.begin() + t * (dc + dr) + dc, ckv.begin() + (t + 1) * (dc + dr));
      if (m.rope_interleave)
        rope_deepseek(kr.data(), t, dr);
      else
        rope_half(kr.data(), t, dr);
      for (int64_t hh = 0; hh < H; ++hh) {
        float* qr = &q[idx(t, hh * dqk + dn, H * dqk)];
        if (m.rope_interleave)
          rope_deepseek(qr, t, dr);
        else
          rope_half(qr, t, dr);
        for (int64_t e = 0; e < dn; ++e)
          K[idx(t, hh * dqk + e, H * dqk)] = kvb[idx(t, hh * (dn + dv) + e, H * (dn + dv))];
        for (int64_t e = 0; e < dr; ++e)
          K[idx(t, hh * dqk + dn + e, H * dqk)] = kr[static_cast<size_t>(e)];
        for (int64_t e = 0; e < dv; ++e)
          V[idx(t, hh * dv + e, H * dv)] = kvb[idx(t, hh * (dn + dv) + dn + e, H * (dn + dv))];
      }
    }
    std::vector<float> att;
    attend(l, S, H, H, dqk, dv, q, K, V, {}, c_.query_scale, att);
    return linear(att, S, p + "self_attn.o_proj.weight");
  }

  std::vector<float> mlp(const std::vector<float>& h, int64_t S, const std::string& p, int64_t I,
                         double sparsity = 0) const {
    std::vector<float> g = linear(h, S, p + "gate_proj.weight");
    if (sparsity > 0) {
      // Gemma3nTextMLP._gaussian_topk with z = Phi^-1(sparsity) found by bisection.
      double lo = -10, hi = 10;
      for (int it = 0; it < 200; ++it) {
        const double mid = 0.5 * (lo + hi);
        (0.5 * std::erfc(-mid / std::sqrt(2.0)) < sparsity ? lo : hi) = mid;
      }
      const double z = 0.5 * (lo + hi);
      const int64_t n = static_cast<int64_t>(g.size()) / S;
      for (int64_t t = 0; t < S; ++t) {
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n; ++i) mean += g[idx(t, i, n)];
        mean /= static_cast<double>(n);
        for (int64_t i = 0; i < n; ++i) var += (g[idx(t, i, n)] - mean) * (g[idx(t, i, n)] - mean);
        const double cut = mean + std::sqrt(var / static_cast<double>(n)) * z;
        for (int64_t i = 0; i < n; ++i)
          g[idx(t, i, n)] = static_cast<float>(std::max(g[idx(t, i, n)] - cut, 0.0));
      }
    }
    const std::vector<float> u = linear(h, S, p + "up_proj.weight");
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = g[i];
      const double a =
          c_.ffn_act == FfnActivation::kGeluTanh
              ? 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)))
              : x / (1.0 + std::exp(-x));
      g[i] = static_cast<float>(a * u[i]);
    }
    (void)I;
    return linear(g, S, p + "down_proj.weight");
  }

  std::vector<float> moe(const std::vector<float>& h, int64_t S, const std::string& p) const {
    const MoeConfig& m = c_.moe;
    const int64_t dim = c_.dim, E = m.n_experts, K = m.n_experts_used, I = m.expert_hidden_dim;
    std::vector<float> out(static_cast<size_t>(S * dim), 0.0f);
    const bool oss = m.router == MoeRouter::kGptOss;
    const std::vector<float> logits =
        linear(h, S, p + (oss ? "mlp.router.weight" : "mlp.gate.weight"),
               oss ? p + "mlp.router.bias" : "");
    for (int64_t t = 0; t < S; ++t) {
      std::vector<double> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) score[static_cast<size_t>(e)] = logits[idx(t, e, E)];
      if (m.router == MoeRouter::kDeepseekV3) {
        const std::vector<float> bias = get(p + "mlp.gate.e_score_correction_bias");
        for (int64_t e = 0; e < E; ++e) {
          score[static_cast<size_t>(e)] = 1.0 / (1.0 + std::exp(-score[static_cast<size_t>(e)]));
          choice[static_cast<size_t>(e)] =
              score[static_cast<size_t>(e)] + bias[static_cast<size_t>(e)];
        }
        const int64_t G = m.n_group, per = E / G;
        std::vector<std::pair<double, int64_t>> gs;
        for (int64_t g = 0; g < G; ++g) {
          std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
          std::sort(v.rbegin(), v.rend());
          gs.push_back({v[0] + (per > 1 ? v[1] : 0.0), g});
        }
        std::sort(gs.begin(), gs.end(), [](auto a, auto b) {
          return a.first > b.first || (a.first == b.first && a.second < b.second);
        });
        for (int64_t e = 0; e < E; ++e) {
          bool kept = false;
          for (int64_t i = 0; i < m.topk_group; ++i)
            kept |= gs[static_cast<size_t>(i)].second == e / per;
          if (!kept) choice[static_cast<size_t>(e)] = 0.0;
        }
      } else if (m.router == MoeRouter::kSoftmaxGreedy) {
        const double mx = *std::max_element(score.begin(), score.end());
        double den = 0;
        for (double& s : score) den += (s = std::exp(s - mx));
        for (int64_t e = 0; e < E; ++e)
          choice[static_cast<size_t>(e)] = score[static_cast<size_t>(e)] /= den;
      } else {
        choice = score;
      }
      std::vector<int64_t> order(static_cast<size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return choice[static_cast<size_t>(a)] > choice[static_cast<size_t>(b)];
      });
      std::vector<double> w(static_cast<size_t>(K));
      if (oss) {  // softmax over the top-k logits
        double den = 0;
        for (int64_t i = 0; i < K; ++i)
          den += std::exp(score[static_cast<size_t>(order[static_cast<size_t>(i)])] -
                          score[static_cast<size_t>(order[0])]);
        for (int64_t i = 0; i < K; ++i)
          w[static_cast<size_t>(i)] =
              std::exp(score[static_cast<size_t>(order[static_cast<size_t>(i)])] -
                       score[static_cast<size_t>(order[0])]) /
              den;
      } else {
        double sum = 0;
        for (int64_t i = 0; i < K; ++i)
          sum += w[static_cast<size_t>(i)] =
              score[static_cast<size_t>(order[static_cast<size_t>(i)])];
        for (double& x : w) {
          if (m.router == MoeRouter::kDeepseekV3) {  // DeepseekV3TopkRouter
            x = (m.norm_topk_prob ? x / (sum + 1e-20) : x) * m.routed_scaling_factor;
          } else {  // DeepSeek-V2 MoEGate: normalised weights are not scaled
            x = K > 1 && m.norm_topk_prob ? x / (sum + 1e-20) : x * m.routed_scaling_factor;
          }
        }
      }
      const std::vector<float> ht(h.begin() + t * dim, h.begin() + (t + 1) * dim);
      for (int64_t i = 0; i < K; ++i) {
        const int64_t e = order[static_cast<size_t>(i)];
        std::vector<float> y;
        if (oss) {
          // GptOssExperts: gate_up = x @ W[e] + b; gate/up interleaved; clamp; (up + 1) * glu.
          const std::vector<float> gu_w = get(p + "mlp.experts.gate_up_proj"),
                                   gu_b = get(p + "mlp.experts.gate_up_proj_bias");
          const std::vector<float> dn_w = get(p + "mlp.experts.down_proj"),
                                   dn_b = get(p + "mlp.experts.down_proj_bias");
          std::vector<double> gu(static_cast<size_t>(2 * I));
          for (int64_t j = 0; j < 2 * I; ++j) {
            double a = gu_b[idx(e, j, 2 * I)];
            for (int64_t d = 0; d < dim; ++d)
              a += static_cast<double>(ht[static_cast<size_t>(d)]) *
                   gu_w[static_cast<size_t>((e * dim + d) * 2 * I + j)];
            gu[static_cast<size_t>(j)] = a;
          }
          std::vector<double> act(static_cast<size_t>(I));
          for (int64_t j = 0; j < I; ++j) {
            const double g =
                std::min(gu[static_cast<size_t>(2 * j)], static_cast<double>(m.swiglu_limit));
            const double u =
                std::clamp(gu[static_cast<size_t>(2 * j + 1)], -static_cast<double>(m.swiglu_limit),
                           static_cast<double>(m.swiglu_limit));
            act[static_cast<size_t>(j)] = (u + 1.0) * g / (1.0 + std::exp(-g * m.swiglu_alpha));
          }
          y.resize(static_cast<size_t>(dim));
          for (int64_t d = 0; d < dim; ++d) {
            double a = dn_b[idx(e, d, dim)];
            for (int64_t j = 0; j < I; ++j)
              a += act[static_cast<size_t>(j)] * dn_w[static_cast<size_t>((e * I + j) * dim + d)];
            y[static_cast<size_t>(d)] = static_cast<float>(a);
          }
        } else {
          y = mlp(ht, 1, p + "mlp.experts." + std::to_string(e) + ".", I);
        }
        for (int64_t d = 0; d < dim; ++d)
          out[idx(t, d, dim)] +=
              static_cast<float>(w[static_cast<size_t>(i)] * y[static_cast<size_t>(d)]);
      }
    }
    if (!oss && m.n_shared_experts > 0) {
      const std::vector<float> sh = mlp(h, S, p + "mlp.shared_experts.", I * m.n_shared_experts);
      for (size_t i = 0; i < out.size(); ++i) out[i] += sh[i];
    }
    return out;
  }

  // Gemma3nTextModel.forward + Gemma3nTextDecoderLayer.forward, all in double-rounded float.
  std::vector<float> gemma3n(const std::vector<int32_t>& ids) const {
    const Gemma3nConfig& g = c_.gemma3n;
    const int64_t S = static_cast<int64_t>(ids.size()), dim = c_.dim, A = g.altup_num_inputs;
    const int64_t P = g.hidden_size_per_layer_input, NL = c_.n_layers;
    const std::vector<float> emb = get("model.embed_tokens.weight"),
                             emb_pl = get("model.embed_tokens_per_layer.weight");
    std::vector<float> e(static_cast<size_t>(S * dim));
    for (int64_t t = 0; t < S; ++t)
      for (int64_t d = 0; d < dim; ++d)
        e[idx(t, d, dim)] =
            emb[idx(ids[static_cast<size_t>(t)], d, dim)] * std::sqrt(static_cast<float>(dim));
    // per-layer inputs [S, NL, P]
    std::vector<float> proj = linear(e, S, "model.per_layer_model_projection.weight");
    for (float& v : proj) v *= static_cast<float>(std::pow(static_cast<double>(dim), -0.5));
    proj = norm(proj, S * NL, P, "model.per_layer_projection_norm.weight", c_.rms_eps);
    for (int64_t t = 0; t < S; ++t) {
      const int32_t id = ids[static_cast<size_t>(t)] < g.vocab_size_per_layer_input
                             ? ids[static_cast<size_t>(t)]
                             : 0;
      for (int64_t i = 0; i < NL * P; ++i) {
        const double pl = emb_pl[idx(id, i, NL * P)] * std::sqrt(static_cast<double>(P));
        proj[idx(t, i, NL * P)] =
            static_cast<float>((proj[idx(t, i, NL * P)] + pl) / std::sqrt(2.0));
      }
    }
    auto rms = [&](const std::vector<float>& v, int64_t t) {
      double s2 = 0;
      for (int64_t d = 0; d < dim; ++d)
        s2 += static_cast<double>(v[idx(t, d, dim)]) * v[idx(t, d, dim)];
      return s2 / static_cast<double>(dim);
    };
    auto rescale = [&](std::vector<float>& v, const std::vector<float>& target) {
      for (int64_t t = 0; t < S; ++t) {
        const double tm = std::sqrt(rms(target, t)), m = std::sqrt(std::max(rms(v, t), 1e-5));
        for (int64_t d = 0; d < dim; ++d)
          v[idx(t, d, dim)] = static_cast<float>(v[idx(t, d, dim)] * tm / m);
      }
    };
    std::vector<std::vector<float>> hs{e};
    for (int64_t i = 1; i < A; ++i) {
      hs.push_back(linear(e, S, "model.altup_projections." + std::to_string(i - 1) + ".weight"));
      rescale(hs.back(), e);
    }
    for (int64_t l = 0; l < NL; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      auto modal = [&](const std::vector<float>& v) {
        std::vector<float> n = norm(v, S, dim, p + "altup.router_norm.weight", c_.rms_eps);
        for (float& x : n) x = static_cast<float>(x / static_cast<double>(dim));
        std::vector<float> m = linear(n, S, p + "altup.modality_router.weight");
        for (float& x : m) x = std::tanh(x);
        return m;  // [S, A]
      };
      const std::vector<float> mp = modal(hs[0]);
      const std::vector<float> pc = get(p + "altup.prediction_coefs.weight");  // [A*A, A]
      std::vector<std::vector<float>> pred = hs;
      for (int64_t t = 0; t < S; ++t)
        for (int64_t b = 0; b < A; ++b)
          for (int64_t d = 0; d < dim; ++d) {
            double acc = hs[static_cast<size_t>(b)][idx(t, d, dim)];
            for (int64_t a = 0; a < A; ++a) {
              double coef = 0;
              for (int64_t k = 0; k < A; ++k)
                coef += static_cast<double>(pc[idx(b * A + a, k, A)]) * mp[idx(t, k, A)];
              acc += coef * hs[static_cast<size_t>(a)][idx(t, d, dim)];
            }
            pred[static_cast<size_t>(b)][idx(t, d, dim)] = static_cast<float>(acc);
          }
      const std::vector<float>& active = pred[0];
      const std::vector<float> xn = norm(active, S, dim, p + "input_layernorm.weight", c_.rms_eps);
      std::vector<float> laurel = norm(linear(linear(xn, S, p + "laurel.linear_left.weight"), S,
                                              p + "laurel.linear_right.weight"),
                                       S, dim, p + "laurel.post_laurel_norm.weight", c_.rms_eps);
      for (size_t i = 0; i < laurel.size(); ++i) laurel[i] += xn[i];
      const std::vector<float> attn =
          norm(gqa(xn, S, l, p), S, dim, p + "post_attention_layernorm.weight", c_.rms_eps);
      std::vector<float> x(static_cast<size_t>(S * dim));
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = static_cast<float>((static_cast<double>(active[i]) + attn[i] + laurel[i]) /
                                  std::sqrt(2.0));
      const std::vector<float> f =
          norm(mlp(norm(x, S, dim, p + "pre_feedforward_layernorm.weight", c_.rms_eps), S,
                   p + "mlp.", 0, g.activation_sparsity[static_cast<size_t>(l)]),
               S, dim, p + "post_feedforward_layernorm.weight", c_.rms_eps);
      for (size_t i = 0; i < x.size(); ++i) x[i] += f[i];
      const std::vector<float> mc = modal(x);
      std::vector<float> cc = get(p + "altup.correction_coefs.weight");  // [A, A], clipped
      for (float& w : cc) w = std::clamp(w, -g.altup_coef_clip, g.altup_coef_clip);
      for (int64_t t = 0; t < S; ++t)
        for (int64_t i = 0; i < A; ++i) {
          double coef = 1.0;
          for (int64_t k = 0; k < A; ++k)
            coef += static_cast<double>(cc[idx(i, k, A)]) * mc[idx(t, k, A)];
          for (int64_t d = 0; d < dim; ++d)
            hs[static_cast<size_t>(i)][idx(t, d, dim)] = static_cast<float>(
                pred[static_cast<size_t>(i)][idx(t, d, dim)] +
                (static_cast<double>(x[idx(t, d, dim)]) - active[idx(t, d, dim)]) * coef);
        }
      std::vector<float> first = hs[0];
      const std::vector<float> scale = get(p + "altup.correct_output_scale");
      if (g.altup_correct_scale)
        for (int64_t t = 0; t < S; ++t)
          for (int64_t d = 0; d < dim; ++d) first[idx(t, d, dim)] *= scale[static_cast<size_t>(d)];
      std::vector<float> gate = linear(first, S, p + "per_layer_input_gate.weight");  // [S, P]
      for (int64_t t = 0; t < S; ++t)
        for (int64_t i = 0; i < P; ++i) {
          const double v = gate[idx(t, i, P)];
          const double gl =
              0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
          gate[idx(t, i, P)] = static_cast<float>(gl * proj[idx(t, l * P + i, NL * P)]);
        }
      const std::vector<float> pl = norm(linear(gate, S, p + "per_layer_projection.weight"), S, dim,
                                         p + "post_per_layer_input_norm.weight", c_.rms_eps);
      for (int64_t i = 1; i < A; ++i)
        for (size_t k = 0; k < pl.size(); ++k) hs[static_cast<size_t>(i)][k] += pl[k];
    }
    std::vector<float> avg = hs[0];
    for (int64_t i = 1; i < A; ++i) {
      std::vector<float> u =
          linear(hs[static_cast<size_t>(i)], S,
                 "model.altup_unembed_projections." + std::to_string(i - 1) + ".weight");
      rescale(u, hs[0]);
      for (size_t k = 0; k < u.size(); ++k) avg[k] += u[k];
    }
    for (float& v : avg) v = static_cast<float>(v / static_cast<double>(A));
    const std::vector<float> h = norm(avg, S, dim, "model.norm.weight", c_.rms_eps);
    std::vector<float> out =
        linear(h, S, c_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    if (c_.final_softcap > 0)
      for (float& v : out) v = std::tanh(v / c_.final_softcap) * c_.final_softcap;
    return out;
  }

  const ModelFile& f_;
  const ModelConfig& c_;
  mutable float theta_ = 0;                                  // RoPE theta of the current layer
  mutable bool local_rope_ = false;                          // Gemma-3 sliding layer: no scaling
  mutable std::vector<std::vector<float>> kept_k_, kept_v_;  // post-RoPE K/V per layer
};

}  // namespace kvcache::testing_util
