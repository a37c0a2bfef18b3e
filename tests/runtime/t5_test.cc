// T5 (model/t5.h) against an independent restatement of transformers' modeling_t5.py written
// here in plain loops (double precision, no cache, the whole decoder sequence at once): a tiny
// Hugging Face folder with random weights and the real tensor names, relu + tied head and
// gated-gelu + untied head. Then decode token by token through the EncoderDecoderCache equals
// the full recompute for the dynamic, static and paged self-attention caches.
#include "model/t5.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>

#include "core/error.h"
#include "model/safetensors.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

using testing_util::ScratchDir;

// ---- the test's own T5 folder -----------------------------------------------------------

struct TinySpec {
  bool gated = false;
  bool tied = true;
  int64_t vocab = 40, d = 16, d_kv = 6, heads = 3, d_ff = 24, enc_layers = 2, dec_layers = 2;
  int64_t buckets = 8, max_distance = 12;
};

std::string config_json(const TinySpec& s) {
  return std::string(R"({"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", )") +
         "\"vocab_size\": " + std::to_string(s.vocab) + ", \"d_model\": " + std::to_string(s.d) +
         ", \"d_kv\": " + std::to_string(s.d_kv) + ", \"num_heads\": " + std::to_string(s.heads) +
         ", \"d_ff\": " + std::to_string(s.d_ff) +
         ", \"num_layers\": " + std::to_string(s.enc_layers) +
         ", \"num_decoder_layers\": " + std::to_string(s.dec_layers) +
         ", \"relative_attention_num_buckets\": " + std::to_string(s.buckets) +
         ", \"relative_attention_max_distance\": " + std::to_string(s.max_distance) +
         ", \"layer_norm_epsilon\": 1e-6, \"feed_forward_proj\": \"" +
         (s.gated ? "gated-gelu" : "relu") +
         "\", \"tie_word_embeddings\": " + (s.tied ? "true" : "false") +
         ", \"decoder_start_token_id\": 0, \"eos_token_id\": 1}";
}

void write_folder(const std::string& dir, const TinySpec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::pair<std::string, Tensor>> owned;
  auto add = [&](const std::string& name, Shape shape, float mean, float sd) {
    Tensor t = Tensor::empty(DType::kF32, shape);
    std::normal_distribution<float> dist(mean, sd);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(rng);
    owned.emplace_back(name, std::move(t));
  };
  const int64_t in = s.heads * s.d_kv;
  const float sd = 1.0f / std::sqrt(static_cast<float>(s.d));
  add("shared.weight", {s.vocab, s.d}, 0, 1);
  if (!s.tied) add("lm_head.weight", {s.vocab, s.d}, 0, sd);
  for (int dec = 0; dec < 2; ++dec) {
    const std::string stack = dec ? "decoder" : "encoder";
    for (int64_t l = 0; l < (dec ? s.dec_layers : s.enc_layers); ++l) {
      const std::string p = stack + ".block." + std::to_string(l) + ".layer.";
      std::vector<std::string> attns = {"0.SelfAttention."};
      if (dec) attns.push_back("1.EncDecAttention.");
      for (size_t a = 0; a < attns.size(); ++a) {
        add(p + std::to_string(a) + ".layer_norm.weight", {s.d}, 1, 0.2f);
        for (const char* m : {"q", "k", "v"}) add(p + attns[a] + m + ".weight", {in, s.d}, 0, sd);
        add(p + attns[a] + "o.weight", {s.d, in}, 0, 0.3f);
      }
      if (l == 0)
        add(p + "0.SelfAttention.relative_attention_bias.weight", {s.buckets, s.heads}, 0, 1);
      const std::string f = p + std::to_string(attns.size()) + ".";
      add(f + "layer_norm.weight", {s.d}, 1, 0.2f);
      if (s.gated) {
        add(f + "DenseReluDense.wi_0.weight", {s.d_ff, s.d}, 0, sd);
        add(f + "DenseReluDense.wi_1.weight", {s.d_ff, s.d}, 0, sd);
      } else {
        add(f + "DenseReluDense.wi.weight", {s.d_ff, s.d}, 0, sd);
      }
      add(f + "DenseReluDense.wo.weight", {s.d, s.d_ff}, 0, 0.3f);
    }
    add(stack + ".final_layer_norm.weight", {s.d}, 1, 0.2f);
  }
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [n, t] : owned) views.emplace_back(n, t.view());
  write_safetensors(dir + "/model.safetensors", views, {{"format", "pt"}});
  std::ofstream(dir + "/config.json") << config_json(s);
}

// ---- the reference: modeling_t5.py restated ----------------------------------------------

using Vec = std::vector<double>;
using Mat = std::vector<Vec>;  // rows

class Reference {
 public:
  Reference(const std::string& dir, const TinySpec& s) : s_(s) {
    auto f = SafetensorsFile::open(dir + "/model.safetensors");
    for (const auto& [name, t] : f->tensors()) {
      std::vector<float> v(static_cast<size_t>(t.numel()));
      convert_n(t.data(), t.dtype(), v.data(), DType::kF32, v.size());
      w_[name] = Vec(v.begin(), v.end());
    }
  }

  // Logits of every decoder position: [dec.size()][vocab].
  Mat logits(const std::vector<int32_t>& enc, const std::vector<int32_t>& dec) const {
    Mat h = embed(enc);
    for (int64_t l = 0; l < s_.enc_layers; ++l) {
      const std::string p = "encoder.block." + std::to_string(l) + ".layer.";
      add(h, attention(norm(h, p + "0.layer_norm.weight"), nullptr, p + "0.SelfAttention.",
                       "encoder", true, false));
      add(h, ff(norm(h, p + "1.layer_norm.weight"), p + "1.DenseReluDense."));
    }
    const Mat enc_out = norm(h, "encoder.final_layer_norm.weight");
    Mat x = embed(dec);
    for (int64_t l = 0; l < s_.dec_layers; ++l) {
      const std::string p = "decoder.block." + std::to_string(l) + ".layer.";
      add(x, attention(norm(x, p + "0.layer_norm.weight"), nullptr, p + "0.SelfAttention.",
                       "decoder", false, true));
      add(x, attention(norm(x, p + "1.layer_norm.weight"), &enc_out, p + "1.EncDecAttention.", "",
                       false, false));
      add(x, ff(norm(x, p + "2.layer_norm.weight"), p + "2.DenseReluDense."));
    }
    Mat out = norm(x, "decoder.final_layer_norm.weight");
    if (s_.tied)  // T5ForConditionalGeneration: rescale before the tied head
      for (Vec& r : out)
        for (double& v : r) v *= std::pow(static_cast<double>(s_.d), -0.5);
    return project(out, s_.tied ? "shared.weight" : "lm_head.weight", s_.vocab, s_.d);
  }

 private:
  const Vec& t(const std::string& n) const {
    auto it = w_.find(n);
    if (it == w_.end()) throw std::runtime_error("reference: no tensor " + n);
    return it->second;
  }
  Mat embed(const std::vector<int32_t>& ids) const {
    Mat m;
    for (int32_t id : ids)
      m.emplace_back(t("shared.weight").begin() + id * s_.d,
                     t("shared.weight").begin() + (id + 1) * s_.d);
    return m;
  }
  static void add(Mat& a, const Mat& b) {
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t j = 0; j < a[i].size(); ++j) a[i][j] += b[i][j];
  }
  // T5LayerNorm: variance without mean, no bias.
  Mat norm(const Mat& x, const std::string& name) const {
    Mat y = x;
    for (Vec& r : y) {
      double var = 0;
      for (double v : r) var += v * v;
      var /= static_cast<double>(r.size());
      for (size_t i = 0; i < r.size(); ++i) r[i] = t(name)[i] * (r[i] / std::sqrt(var + 1e-6));
    }
    return y;
  }
  // y = x W^T, W [out, in].
  Mat project(const Mat& x, const std::string& name, int64_t out, int64_t in) const {
    const Vec& W = t(name);
    Mat y(x.size(), Vec(static_cast<size_t>(out), 0.0));
    for (size_t r = 0; r < x.size(); ++r)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) y[r][o] += W[o * in + i] * x[r][i];
    return y;
  }
  // _relative_position_bucket, restated (float32 for the log part, as torch computes it).
  int64_t bucket(int64_t rel, bool bidirectional) const {
    int64_t nb = s_.buckets, ret = 0;
    if (bidirectional) {
      nb /= 2;
      ret += rel > 0 ? nb : 0;
      rel = std::abs(rel);
    } else {
      rel = -std::min<int64_t>(rel, 0);
    }
    const int64_t max_exact = nb / 2;
    if (rel < max_exact) return ret + rel;
    const float lf =
        std::log(static_cast<float>(rel) / static_cast<float>(max_exact)) /
        static_cast<float>(std::log(static_cast<double>(s_.max_distance) / max_exact)) *
        static_cast<float>(nb - max_exact);
    return ret + std::min<int64_t>(max_exact + static_cast<int64_t>(lf), nb - 1);
  }
  // T5Attention: no 1/sqrt(d) scaling; the first layer's bias table for self-attention.
  Mat attention(const Mat& x, const Mat* kv, const std::string& p, const std::string& stack,
                bool bidirectional, bool causal) const {
    const int64_t in = s_.heads * s_.d_kv;
    const Mat& src = kv != nullptr ? *kv : x;
    const Mat q = project(x, p + "q.weight", in, s_.d);
    const Mat k = project(src, p + "k.weight", in, s_.d);
    const Mat v = project(src, p + "v.weight", in, s_.d);
    const Vec* bias = stack.empty() ? nullptr
                                    : &t(stack +
                                         ".block.0.layer.0.SelfAttention."
                                         "relative_attention_bias.weight");
    Mat o(x.size(), Vec(static_cast<size_t>(in), 0.0));
    for (int64_t h = 0; h < s_.heads; ++h)
      for (size_t i = 0; i < x.size(); ++i) {
        Vec sc(src.size());
        double mx = -1e300;
        for (size_t j = 0; j < src.size(); ++j) {
          double d = 0;
          for (int64_t e = 0; e < s_.d_kv; ++e) d += q[i][h * s_.d_kv + e] * k[j][h * s_.d_kv + e];
          if (bias != nullptr) {
            const int64_t rel = static_cast<int64_t>(j) - static_cast<int64_t>(i);
            d += (*bias)[bucket(rel, bidirectional) * s_.heads + h];
          }
          if (causal && j > i) d = -1e300;
          sc[j] = d;
          mx = std::max(mx, d);
        }
        double sum = 0;
        for (double& v2 : sc) sum += (v2 = v2 <= -1e299 ? 0 : std::exp(v2 - mx));
        for (size_t j = 0; j < src.size(); ++j)
          for (int64_t e = 0; e < s_.d_kv; ++e)
            o[i][h * s_.d_kv + e] += sc[j] / sum * v[j][h * s_.d_kv + e];
      }
    return project(o, p + "o.weight", s_.d, in);
  }
  Mat ff(const Mat& x, const std::string& p) const {
    Mat h;
    if (s_.gated) {  // T5DenseGatedActDense with gelu_new
      h = project(x, p + "wi_0.weight", s_.d_ff, s_.d);
      const Mat u = project(x, p + "wi_1.weight", s_.d_ff, s_.d);
      for (size_t r = 0; r < h.size(); ++r)
        for (size_t i = 0; i < h[r].size(); ++i) {
          const double g = h[r][i];
          h[r][i] = 0.5 * g * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g))) *
                    u[r][i];
        }
    } else {
      h = project(x, p + "wi.weight", s_.d_ff, s_.d);
      for (Vec& r : h)
        for (double& v : r) v = std::max(v, 0.0);
    }
    return project(h, p + "wo.weight", s_.d, s_.d_ff);
  }

  TinySpec s_;
  std::map<std::string, Vec> w_;
};

std::vector<int32_t> ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(static_cast<int32_t>(rng() % vocab));
  return out;
}

double max_abs_diff(const float* a, const Vec& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

class T5Reference : public ::testing::TestWithParam<bool> {};

TEST_P(T5Reference, LogitsMatchAnIndependentRestatement) {
  TinySpec s;
  s.gated = GetParam();
  s.tied = !s.gated;
  if (s.gated) s.dec_layers = 3;  // encoder and decoder depths differ
  ScratchDir dir("t5ref");
  write_folder(dir.str(), s, s.gated ? 11 : 7);
  auto model = T5Model::load(dir.str());
  ASSERT_EQ(model->config().gated, s.gated);
  ASSERT_EQ(model->config().tie_word_embeddings, s.tied);
  // Longer than max_distance on both sides: the log-spaced and the clamped buckets are used.
  const std::vector<int32_t> enc = ids(19, s.vocab, 3);
  std::vector<int32_t> dec = ids(15, s.vocab, 4);
  dec[0] = model->config().decoder_start_token_id;
  const Mat want = Reference(dir.str(), s).logits(enc, dec);

  T5Runner run(*model);
  // Whole decoder sequence in one call (every position's logits).
  {
    EncoderDecoderCache cache(t5_cache_config(model->config(), {}));
    run.encode(enc.data(), 1, static_cast<int64_t>(enc.size()), cache);
    const auto got = run.decode(dec.data(), 1, static_cast<int64_t>(dec.size()), 0, cache, true);
    for (size_t i = 0; i < dec.size(); ++i)
      EXPECT_LT(max_abs_diff(got.data() + i * s.vocab, want[i]), 5e-4) << "position " << i;
  }
  // Token by token through the cache.
  {
    EncoderDecoderCache cache(t5_cache_config(model->config(), {}));
    run.encode(enc.data(), 1, static_cast<int64_t>(enc.size()), cache);
    for (size_t i = 0; i < dec.size(); ++i) {
      const auto got = run.decode(&dec[i], 1, 1, static_cast<int64_t>(i), cache, false);
      EXPECT_LT(max_abs_diff(got.data(), want[i]), 5e-4) << "step " << i;
    }
  }
  // The reference is sensitive to what it checks: a wrong bucket direction changes the logits.
  double spread = 0;
  for (size_t i = 1; i < want.size(); ++i)
    for (size_t j = 0; j < want[i].size(); ++j)
      spread = std::max(spread, std::fabs(want[i][j] - want[0][j]));
  EXPECT_GT(spread, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Ffn, T5Reference, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "GatedGelu" : "Relu"; });

TEST(T5Config, BucketsFollowTransformers) {
  // Values of modeling_t5.py's _relative_position_bucket with the defaults (32 buckets, max
  // distance 128): bidirectional exact buckets 0..7, positive offsets in 16..31, log buckets,
  // and the clamp at the last bucket.
  EXPECT_EQ(t5_relative_position_bucket(0, true, 32, 128), 0);
  EXPECT_EQ(t5_relative_position_bucket(-3, true, 32, 128), 3);
  EXPECT_EQ(t5_relative_position_bucket(3, true, 32, 128), 19);
  EXPECT_EQ(t5_relative_position_bucket(-12, true, 32, 128), 9);  // 8 + int(log(1.5)/log(16)*8)
  EXPECT_EQ(t5_relative_position_bucket(-1000, true, 32, 128), 15);
  EXPECT_EQ(t5_relative_position_bucket(1000, true, 32, 128), 31);
  // Unidirectional: keys after the query share bucket 0; 16 exact buckets.
  EXPECT_EQ(t5_relative_position_bucket(5, false, 32, 128), 0);
  EXPECT_EQ(t5_relative_position_bucket(-15, false, 32, 128), 15);
  EXPECT_EQ(t5_relative_position_bucket(-20, false, 32, 128), 17);  // 16 + int(log(1.25)/log(8)*16)
  EXPECT_EQ(t5_relative_position_bucket(-500, false, 32, 128), 31);
}

TEST(T5Config, RefusesWhatItCannotRun) {
  TinySpec s;
  std::string j = config_json(s);
  EXPECT_NO_THROW(parse_t5_config(j, "x"));
  const std::string swish = std::string(j).replace(j.find("relu"), 4, "silu");
  EXPECT_THROW(parse_t5_config(swish, "x"), Error);
  EXPECT_TRUE(config_is_encoder_decoder(j));
  EXPECT_FALSE(config_is_encoder_decoder(R"({"model_type": "llama"})"));
  EXPECT_TRUE(is_encoder_decoder_model("dummy:t5-tiny"));
  EXPECT_FALSE(is_encoder_decoder_model("dummy:tiny"));
}

TEST(T5Model, MissingTensorIsNamed) {
  TinySpec s;
  ScratchDir dir("t5missing");
  write_folder(dir.str(), s, 1);
  // Same folder, but the config asks for a third decoder layer the file does not have.
  s.dec_layers = 3;
  std::ofstream(dir.file("config.json")) << config_json(s);
  try {
    T5Model::load(dir.str());
    FAIL() << "loaded a model with a missing layer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("decoder.block.2.layer.0.layer_norm.weight"),
              std::string::npos)
        << e.what();
  }
}

// Decode token by token ≡ a fresh full recompute at every step, on dummy:t5-tiny, per cache.
class T5Decode : public ::testing::TestWithParam<std::string> {};

TEST_P(T5Decode, DecodeEqualsRecompute) {
  ScratchDir dir("t5dummy");
  auto model = T5Model::load(build_dummy_t5("t5-tiny", 0, dir.str()));
  const T5Config& c = model->config();
  CacheOptions o;
  o.implementation = GetParam();
  o.max_cache_len = 24;
  o.max_batch_size = 2;
  o.paged.block_tokens = 4;  // several blocks per sequence
  const int64_t B = 2, S_enc = 9, steps = 20;
  std::vector<int32_t> enc = ids(B * S_enc, c.vocab_size, 5);
  T5Runner run(*model), ref(*model);
  EncoderDecoderCache cache(t5_cache_config(c, o));
  run.encode(enc.data(), B, S_enc, cache);
  // Row b's decoder sequence so far: the start token, then ids that differ per row (teacher
  // forcing: a greedy tiny random model repeats one token, which would hide position errors).
  std::vector<std::vector<int32_t>> seq(B, std::vector<int32_t>{c.decoder_start_token_id});
  const std::vector<int32_t> forced = ids(B * steps, c.vocab_size, 6);
  double worst = 0, rows_apart = 0;
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<int32_t> step;
    for (int64_t b = 0; b < B; ++b) step.push_back(seq[b].back());
    const auto got = run.decode(step.data(), B, 1, t, cache, false);
    std::vector<float> g(got.begin(), got.end());
    // The reference: encoder again and the whole prefix, no cache kept between calls.
    EncoderDecoderCache fresh(t5_cache_config(c, CacheOptions{.implementation = "recompute"}));
    ref.encode(enc.data(), B, S_enc, fresh);
    std::vector<int32_t> all;
    for (int64_t b = 0; b < B; ++b) all.insert(all.end(), seq[b].begin(), seq[b].end());
    const auto want = ref.decode(all.data(), B, t + 1, 0, fresh, false);
    for (size_t i = 0; i < g.size(); ++i)
      worst = std::max(worst, static_cast<double>(std::fabs(g[i] - want[i])));
    for (int64_t v = 0; v < c.vocab_size; ++v)
      rows_apart = std::max(rows_apart, static_cast<double>(std::fabs(g[v] - g[c.vocab_size + v])));
    for (int64_t b = 0; b < B; ++b) seq[b].push_back(forced[b * steps + t]);
  }
  EXPECT_LT(worst, 1e-4);
  EXPECT_EQ(cache.seq_length(), steps);
  EXPECT_EQ(cache.encoder_length(), S_enc);
  // The rows are not one row twice: their logits differ.
  EXPECT_GT(rows_apart, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(Caches, T5Decode, ::testing::Values("dynamic", "static", "paged"),
                         [](const auto& info) { return info.param; });

TEST(T5Decode, RefusesMisuse) {
  ScratchDir dir("t5misuse");
  auto model = T5Model::load(build_dummy_t5("t5-tiny", 0, dir.str()));
  T5Runner run(*model);
  EncoderDecoderCache cache(t5_cache_config(model->config(), {}));
  const int32_t tok = 0;
  EXPECT_THROW(run.decode(&tok, 1, 1, 0, cache, false), Error);  // no encoder output yet
  const std::vector<int32_t> enc = {3, 4, 5};
  run.encode(enc.data(), 1, 3, cache);
  EXPECT_THROW(run.encode(enc.data(), 1, 3, cache), Error);      // computed once
  EXPECT_THROW(run.decode(&tok, 1, 1, 2, cache, false), Error);  // wrong position
  const int32_t bad = 1000;
  EXPECT_THROW(run.decode(&bad, 1, 1, 0, cache, false), Error);
}

}  // namespace
}  // namespace kvcache
