// Plain double-precision references for the Gated DeltaNet kernels (kernels/gated_delta.h,
// kernels/causal_conv.h), written from transformers' models/qwen3_next/modeling_qwen3_next.py:
// torch_recurrent_gated_delta_rule (token by token, in its order of operations), l2norm,
// torch_causal_conv1d_update / the prefill's F.conv1d with K - 1 zeros of left padding,
// Qwen3NextRMSNormGated and the gates of Qwen3NextGatedDeltaNet.forward. Inputs are f32 (what the
// kernels read), every intermediate is double; all arrays contiguous row-major.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvcache::gdn_ref {

struct Sizes {
  int64_t T = 0, Hk = 0, Hv = 0, dk = 0, dv = 0;
};

// q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv]; state [Hv, dk, dv], updated in place.
// Returns out [T, Hv, dv]. scale 0: 1 / sqrt(dk). mag, if given, receives [T, Hv, dv] the
// magnitude of each output's terms, sum_i |q_i S_ij| (S after the token's update): the scale
// against which a float dot product's rounding is measured (its terms may cancel).
inline std::vector<double> recurrent(const Sizes& s, const float* q, const float* k, const float* v,
                                     const float* g, const float* beta, std::vector<double>& state,
                                     bool l2norm = true, double eps = 1e-6, double scale = 0.0,
                                     std::vector<double>* mag = nullptr) {
  if (scale == 0.0) scale = 1.0 / std::sqrt(static_cast<double>(s.dk));
  std::vector<double> out(static_cast<size_t>(s.T * s.Hv * s.dv));
  if (mag) mag->assign(out.size(), 0.0);
  std::vector<double> qn(static_cast<size_t>(s.dk)), kn(qn.size()), kv(static_cast<size_t>(s.dv));
  const int64_t group = s.Hv / s.Hk;
  for (int64_t t = 0; t < s.T; ++t) {
    for (int64_t h = 0; h < s.Hv; ++h) {
      const float* qs = q + (t * s.Hk + h / group) * s.dk;
      const float* ks = k + (t * s.Hk + h / group) * s.dk;
      double sq = 0, sk = 0;
      for (int64_t i = 0; i < s.dk; ++i) {
        sq += double(qs[i]) * qs[i];
        sk += double(ks[i]) * ks[i];
      }
      const double iq = l2norm ? 1.0 / std::sqrt(sq + eps) : 1.0;
      const double ik = l2norm ? 1.0 / std::sqrt(sk + eps) : 1.0;
      for (int64_t i = 0; i < s.dk; ++i) {
        qn[size_t(i)] = qs[i] * iq * scale;
        kn[size_t(i)] = ks[i] * ik;
      }
      double* S = state.data() + h * s.dk * s.dv;
      const double decay = std::exp(double(g[t * s.Hv + h])), b = beta[t * s.Hv + h];
      for (int64_t i = 0; i < s.dk * s.dv; ++i) S[i] *= decay;
      for (int64_t j = 0; j < s.dv; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < s.dk; ++i) acc += S[i * s.dv + j] * kn[size_t(i)];
        kv[size_t(j)] = acc;
      }
      const float* vs = v + (t * s.Hv + h) * s.dv;
      for (int64_t i = 0; i < s.dk; ++i)
        for (int64_t j = 0; j < s.dv; ++j)
          S[i * s.dv + j] += kn[size_t(i)] * ((vs[j] - kv[size_t(j)]) * b);
      double* o = out.data() + (t * s.Hv + h) * s.dv;
      for (int64_t j = 0; j < s.dv; ++j) {
        double acc = 0, m = 0;
        for (int64_t i = 0; i < s.dk; ++i) {
          acc += S[i * s.dv + j] * qn[size_t(i)];
          m += std::fabs(S[i * s.dv + j] * qn[size_t(i)]);
        }
        o[j] = acc;
        if (mag) (*mag)[size_t((t * s.Hv + h) * s.dv + j)] = m;
      }
    }
  }
  return out;
}

// x [T, C], weight [K, C] (w[j, c] = HF's conv1d.weight[c, 0, j]), bias [C] or nullptr, state [K -
// 1, C] (last K - 1 inputs, oldest first), updated in place. Returns y [T, C].
inline std::vector<double> causal_conv(int64_t T, int64_t C, int64_t K, const float* x,
                                       const float* weight, const float* bias,
                                       std::vector<double>& state, bool silu) {
  std::vector<double> in(static_cast<size_t>((K - 1 + T) * C));  // state rows, then x rows
  for (int64_t i = 0; i < (K - 1) * C; ++i) in[size_t(i)] = state[size_t(i)];
  for (int64_t i = 0; i < T * C; ++i) in[size_t((K - 1) * C + i)] = x[i];
  std::vector<double> y(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < C; ++c) {
      double acc = bias ? bias[c] : 0.0;
      for (int64_t j = 0; j < K; ++j)
        acc += double(weight[j * C + c]) * in[size_t((t + j) * C + c)];
      y[size_t(t * C + c)] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
    }
  }
  for (int64_t i = 0; i < (K - 1) * C; ++i) state[size_t(i)] = in[size_t(T * C + i)];
  return y;
}

// Qwen3NextRMSNormGated over rows of D: w * x / sqrt(mean(x^2) + eps) * silu(z).
inline std::vector<double> rms_norm_gated(int64_t rows, int64_t D, const float* x, const float* z,
                                          const float* w, double eps) {
  std::vector<double> y(static_cast<size_t>(rows * D));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += double(x[r * D + j]) * x[r * D + j];
    const double inv = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t j = 0; j < D; ++j) {
      const double zz = z[r * D + j];
      y[size_t(r * D + j)] = w[j] * (x[r * D + j] * inv) * (zz / (1.0 + std::exp(-zz)));
    }
  }
  return y;
}

// g = -exp(A_log) * softplus(a + dt_bias) (torch's softplus: x > 20 -> x), beta = sigmoid(b).
inline void gates(int64_t T, int64_t Hv, const float* a, const float* b, const float* a_log,
                  const float* dt_bias, std::vector<double>& g, std::vector<double>& beta) {
  g.assign(static_cast<size_t>(T * Hv), 0.0);
  beta.assign(g.size(), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      const double x = double(a[t * Hv + h]) + dt_bias[h];
      const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
      g[size_t(t * Hv + h)] = -std::exp(double(a_log[h])) * sp;
      beta[size_t(t * Hv + h)] = 1.0 / (1.0 + std::exp(-double(b[t * Hv + h])));
    }
  }
}

}  // namespace kvcache::gdn_ref
