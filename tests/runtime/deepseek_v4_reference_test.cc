// DeepSeek-V4 (issue 39, "How it is checked"): the engine against an independent
// double-precision restatement of transformers' modeling_deepseek_v4.py
// (deepseek_v4_reference.h), on a tiny folder this test writes itself (config.json +
// model.safetensors with transformers' parameter names; the same arrays feed the reference).
//   - the reference on its own: Sinkhorn's rows and columns, sqrtsoftplus, the interleaved RoPE
//     on a hand-built row, the legacy config keys, the folder round trip, prefix consistency
//     (position t of a length-n forward equals the last position of a length-(t+1) forward:
//     compressed entries come from whole windows only and are masked causally), and deliberate
//     faults moving the logits far past the tolerance (so the comparisons can fail);
//   - the engine: prompts of 13, 16 and 21 tokens (multiples of the CSA rate 4 and the HCA rate 8
//     and not), 12 greedy tokens so windows close during decode; logits of every generated step
//     within 5e-4 of the reference and identical greedy ids.
#include "deepseek_v4_reference.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/dummy.h"
#include "model/forward.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "scratch_dir.h"
#include "tools/cli_util.h"

namespace kvcache {
namespace {

namespace dsv4 = testing_util::dsv4;
using testing_util::ScratchDir;

constexpr double kTol = 5e-4;
constexpr int kNewTokens = 12;

std::vector<int32_t> prompt(int64_t n, int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % vocab));
  return ids;
}

template <typename A, typename B>
double max_abs_diff(const A& a, const B& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min<size_t>(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  return m;
}

// The largest |engine - reference| over every logit, recorded as a test property (the XML
// output: --gtest_output=xml) and held to kTol. On failure it names the first row (position)
// past the tolerance, which says at which step (prompt position or generated token) the engine
// left the reference.
template <typename A>
void expect_close(const std::string& what, const A& got, const dsv4::Vec& want, int64_t V) {
  const double d = max_abs_diff(got, want);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", d);
  std::string key;
  for (char ch : what)
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_')
      key += ch;
    else if (!key.empty() && key.back() != '_')
      key += '_';
  ::testing::Test::RecordProperty(key, buf);
  int64_t first_bad = -1;
  for (size_t i = 0; i < std::min(got.size(), want.size()) && first_bad < 0; ++i)
    if (std::fabs(static_cast<double>(got[i]) - want[i]) > kTol)
      first_bad = static_cast<int64_t>(i) / V;
  EXPECT_LE(d, kTol) << what << ": first position past the tolerance " << first_bad;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) {
    if (!s.empty()) s += ' ';
    s += std::to_string(id);
  }
  return s;
}

dsv4::Vec last_row(const dsv4::Vec& l, int64_t V) {
  return dsv4::Vec(l.end() - V, l.end());
}

// ------------------------------------------------------------------------------------------
// The reference on its own.

TEST(DeepseekV4ReferenceSelf, SinkhornRowsAndColumnsSumToOne) {
  const int64_t hc = 4, D = 8, M = (2 + hc) * hc;
  std::mt19937_64 rng(3);
  std::normal_distribution<double> n(0.0, 1.0);
  dsv4::Vec x(hc * D), fn(M * hc * D), base(M), scale = {0.9, 1.1, 1.3};
  for (double& v : x) v = n(rng);
  for (double& v : fn) v = 0.3 * n(rng);
  for (double& v : base) v = n(rng);
  const dsv4::HcWeights w =
      dsv4::hyper_connection(x.data(), hc, D, fn, base, scale, 20, 1e-6, 1e-6);
  double off_diag = 0;
  for (int64_t i = 0; i < hc; ++i) {
    double row = 0, col = 0;
    for (int64_t j = 0; j < hc; ++j) {
      row += w.comb[dsv4::ix(i, j, hc)];
      col += w.comb[dsv4::ix(j, i, hc)];
      if (i != j)
        off_diag =
            std::max(off_diag, std::fabs(w.comb[dsv4::ix(i, j, hc)] - w.comb[dsv4::ix(j, i, hc)]));
    }
    EXPECT_NEAR(col, 1.0, 1e-5) << "column " << i;  // the last pass normalises columns
    EXPECT_NEAR(row, 1.0, 1e-3) << "row " << i;     // converged after 20 iterations
    EXPECT_GT(w.pre[static_cast<size_t>(i)], 0.0);
    EXPECT_LT(w.post[static_cast<size_t>(i)], 2.0);
  }
  EXPECT_GT(off_diag, 1e-3) << "a symmetric comb would hide the transposition";
  // One iteration: only the first column pass, the rows are not yet stochastic.
  const dsv4::HcWeights w1 =
      dsv4::hyper_connection(x.data(), hc, D, fn, base, scale, 1, 1e-6, 1e-6);
  double worst_row = 0;
  for (int64_t i = 0; i < hc; ++i) {
    double row = 0;
    for (int64_t j = 0; j < hc; ++j) row += w1.comb[dsv4::ix(i, j, hc)];
    worst_row = std::max(worst_row, std::fabs(row - 1.0));
  }
  EXPECT_GT(worst_row, 1e-2);
}

TEST(DeepseekV4ReferenceSelf, SqrtSoftplusAndInterleavedRope) {
  EXPECT_NEAR(dsv4::sqrtsoftplus(0.0), std::sqrt(std::log(2.0)), 1e-15);
  EXPECT_NEAR(dsv4::sqrtsoftplus(3.0), std::sqrt(std::log1p(std::exp(3.0))), 1e-15);
  EXPECT_NEAR(dsv4::sqrtsoftplus(30.0), std::sqrt(30.0), 1e-15);
  // dim 6, rope 4 on the trailing channels: pairs (2, 3) at theta^0 and (4, 5) at theta^-1/2.
  std::vector<double> x = {7, 8, 1, 2, 3, 4};
  const double pos = 3;
  dsv4::Config c;
  c.head_dim = 6;
  c.partial_rotary_factor = 4.0 / 6.0;
  const dsv4::Config::Rope theta = c.default_rope(100);
  dsv4::rope(x.data(), 6, 4, pos, theta);
  const double a0 = pos, a1 = pos / 10.0;
  EXPECT_EQ(x[0], 7);
  EXPECT_EQ(x[1], 8);
  EXPECT_NEAR(x[2], 1 * std::cos(a0) - 2 * std::sin(a0), 1e-12);
  EXPECT_NEAR(x[3], 2 * std::cos(a0) + 1 * std::sin(a0), 1e-12);
  EXPECT_NEAR(x[4], 3 * std::cos(a1) - 4 * std::sin(a1), 1e-12);
  EXPECT_NEAR(x[5], 4 * std::cos(a1) + 3 * std::sin(a1), 1e-12);
  dsv4::rope(x.data(), 6, 4, pos, theta, -1.0);  // the output de-rotation undoes it
  EXPECT_NEAR(x[2], 1, 1e-12);
  EXPECT_NEAR(x[5], 4, 1e-12);
}

// _compute_yarn_parameters by hand for rope dim 8, base 160000, original context 64, factor 4,
// beta 32 / 1: correction dims 8 ln(64 / (r 2 pi)) / (2 ln 160000) are -0.38 (r = 32, floored
// then clamped to 0) and 0.78 (r = 1, ceiled to 1), so pair 0 keeps its frequency and pairs 1-3
// are divided by the factor; the cos / sin scale stays 1 (V4's attention_factor).
TEST(DeepseekV4ReferenceSelf, YarnOnTheCompressRopeByHand) {
  dsv4::TinySpec s;
  s.yarn_factor = 4;
  const dsv4::Config c = dsv4::parse_config(dsv4::make_tiny(s).config);
  ASSERT_TRUE(c.yarn);
  const dsv4::Config::Rope r = c.compress_rope(), plain = c.default_rope(160000.0);
  ASSERT_EQ(r.inv_freq.size(), 4u);
  EXPECT_DOUBLE_EQ(r.inv_freq[0], 1.0);
  for (size_t i = 1; i < 4; ++i) EXPECT_NEAR(r.inv_freq[i], plain.inv_freq[i] / 4.0, 1e-15) << i;
  EXPECT_EQ(r.scale, 1.0);
  EXPECT_EQ(c.main_rope().inv_freq, c.default_rope(10000.0).inv_freq);  // main: never YaRN
}

TEST(DeepseekV4ReferenceSelf, LegacyConfigKeysReadTheSame) {
  dsv4::TinySpec s;
  const dsv4::Config modern = dsv4::parse_config(dsv4::make_tiny(s).config);
  s.legacy_keys = true;
  const nlohmann::json lj = dsv4::make_tiny(s).config;
  EXPECT_FALSE(lj.contains("layer_types"));
  const dsv4::Config legacy = dsv4::parse_config(lj);
  EXPECT_EQ(legacy.layer_types, modern.layer_types);
  EXPECT_EQ(legacy.mlp_layer_types, modern.mlp_layer_types);
  EXPECT_EQ(legacy.rate_csa, 4);
  EXPECT_EQ(legacy.rate_hca, 8);
  EXPECT_EQ(legacy.rope_dim(), 8);
  EXPECT_EQ(modern.rope_dim(), 8);
  // The class defaults: 2x HCA, then HCA / CSA alternating; 3 hash layers.
  const dsv4::Config d = dsv4::parse_config({{"num_hidden_layers", 5}});
  EXPECT_EQ(d.layer_types, (std::vector<std::string>{
                               "heavily_compressed_attention", "heavily_compressed_attention",
                               "heavily_compressed_attention", "compressed_sparse_attention",
                               "heavily_compressed_attention"}));
  EXPECT_EQ(d.mlp_layer_types,
            (std::vector<std::string>{"hash_moe", "hash_moe", "hash_moe", "moe", "moe"}));
  EXPECT_EQ(d.rope_dim(), 64);
}

TEST(DeepseekV4ReferenceSelf, FolderRoundTrip) {
  const ScratchDir scratch("dsv4ref");
  dsv4::TinySpec s;
  s.matrix_dtype = "BF16";
  const dsv4::Tiny tiny = dsv4::make_tiny(s);
  dsv4::write_folder(scratch.file("m"), tiny);
  const auto [config, w] = dsv4::load_folder(scratch.file("m"));
  EXPECT_EQ(config, tiny.config);
  ASSERT_EQ(w.size(), tiny.weights.size());
  for (const auto& [name, p] : tiny.weights) {
    ASSERT_TRUE(w.count(name)) << name;
    EXPECT_EQ(w.at(name).shape, p.shape) << name;
    EXPECT_EQ(w.at(name).dtype, p.dtype) << name;
    EXPECT_EQ(w.at(name).data, p.data) << name;  // BF16 values were rounded when drawn
  }
  EXPECT_EQ(w.at("model.layers.0.mlp.gate.tid2eid").dtype, "I64");
  EXPECT_EQ(w.at("model.layers.1.self_attn.compressor.position_bias").shape,
            (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(w.at("model.layers.2.self_attn.compressor.position_bias").shape,
            (std::vector<int64_t>{8, 32}));
  EXPECT_EQ(w.at("model.layers.3.mlp.experts.gate_up_proj").shape,
            (std::vector<int64_t>{4, 64, 64}));
  EXPECT_FALSE(w.count("model.layers.0.self_attn.compressor.kv_proj.weight"));
}

TEST(DeepseekV4ReferenceSelf, EveryPositionEqualsItsPrefixForward) {
  const dsv4::Tiny tiny = dsv4::make_tiny({});
  const dsv4::Reference ref(tiny.config, tiny.weights);
  const int64_t V = ref.config().vocab_size;
  const std::vector<int32_t> ids = prompt(21, V);
  const dsv4::Vec all = ref.logits(ids);
  ASSERT_EQ(static_cast<int64_t>(all.size()), 21 * V);
  double spread = 0;
  for (double x : all) spread = std::max(spread, std::fabs(x));
  EXPECT_GT(spread, 0.5) << "degenerate logits would make the comparisons meaningless";
  for (int64_t t = 0; t < 21; ++t) {
    const std::vector<int32_t> pre(ids.begin(), ids.begin() + t + 1);
    const dsv4::Vec row(all.begin() + t * V, all.begin() + (t + 1) * V);
    EXPECT_LE(max_abs_diff(last_row(ref.logits(pre), V), row), 1e-12) << "position " << t;
  }
}

TEST(DeepseekV4ReferenceSelf, FaultsMoveLogitsFarPastTheTolerance) {
  const dsv4::Tiny tiny = dsv4::make_tiny({});
  const dsv4::Reference ref(tiny.config, tiny.weights);
  const std::vector<int32_t> ids = prompt(21, ref.config().vocab_size);
  const dsv4::Vec good = ref.logits(ids);
  auto moved = [&](dsv4::Faults f) {
    return max_abs_diff(dsv4::Reference(tiny.config, tiny.weights, f).logits(ids), good);
  };
  dsv4::Faults f;
  f.no_overlap = true;
  EXPECT_GT(moved(f), 100 * kTol) << "no_overlap";
  f = {};
  f.hca_sees_open_window = true;
  EXPECT_GT(moved(f), 100 * kTol) << "hca_sees_open_window";
  f = {};
  f.no_output_derotation = true;
  EXPECT_GT(moved(f), 100 * kTol) << "no_output_derotation";
  f = {};
  f.no_sinks = true;
  EXPECT_GT(moved(f), 100 * kTol) << "no_sinks";
  f = {};
  f.comb_not_transposed = true;
  EXPECT_GT(moved(f), 100 * kTol) << "comb_not_transposed";
}

// The comparisons below need each top-k to be decided by the scores, not by a tie rule (torch
// leaves topk's order among equal values unspecified): no pick of the indexer or of a router
// sits on a tie, for every prefix the engine is compared at.
TEST(DeepseekV4ReferenceSelf, NoTopKDecidedByATie) {
  const dsv4::Tiny tiny = dsv4::make_tiny({});
  const dsv4::Reference ref(tiny.config, tiny.weights);
  for (int64_t n : {13, 16, 21}) {
    const std::vector<int32_t> ids = prompt(n, ref.config().vocab_size);
    std::vector<int32_t> seq = ids;
    for (int32_t id : ref.greedy(ids, kNewTokens)) seq.push_back(id);
    (void)ref.logits(seq);
  }
  EXPECT_EQ(ref.stats().indexer_ties, 0);
  EXPECT_EQ(ref.stats().router_ties, 0);
}

// ------------------------------------------------------------------------------------------
// The engine against the reference.

// Empty when this build's paged cache serves every layer of the model, else its refusal: the
// paged containers of the compressed layers come with their own change (issue 39 item 1); until
// then the paged comparisons are skipped by name, and they run as soon as the refusal goes.
std::string paged_refusal(const Model& model) {
  try {
    SessionConfig sc;
    sc.cache.implementation = "paged";
    sc.cache.max_cache_len = 64;
    sc.cache.paged.block_tokens = 4;
    Session s(model, sc);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

struct Variant {
  const char* name;
  dsv4::TinySpec spec;
  friend void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"f32", dsv4::TinySpec{}});
  dsv4::TinySpec s;
  s.legacy_keys = true;
  s.matrix_dtype = "BF16";
  s.tid2eid_dtype = "I32";
  s.seed = 11;
  v.push_back({"bf16_legacy_keys_i32_tid2eid", s});
  dsv4::TinySpec y;
  y.yarn_factor = 4;
  v.push_back({"f32_compress_yarn", y});
  // One layer of each kind: a difference in the 5-layer folders shows up in the kind at fault.
  // (Seed 10 for the sliding layer: with 7 two of its greedy logits are within 4e-4.)
  struct Kind {
    const char *name, *attention, *mlp;
    uint64_t seed;
  };
  for (const Kind& k : {Kind{"sliding_hash", "sliding_attention", "hash_moe", 10},
                        Kind{"csa_moe", "compressed_sparse_attention", "moe", 7},
                        Kind{"hca_moe", "heavily_compressed_attention", "moe", 7}}) {
    dsv4::TinySpec one;
    one.layer_types = {k.attention};
    one.mlp_layer_types = {k.mlp};
    one.seed = k.seed;
    v.push_back({k.name, one});
  }
  return v;
}

// One prompt length: the reference's greedy continuation and its logits at every position of
// prompt + continuation (one forward: prefix consistency makes row t the logits after t + 1
// tokens).
struct Expected {
  std::vector<int32_t> ids, greedy, seq;
  dsv4::Vec logits;
};

class DeepseekV4 : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    tiny_ = dsv4::make_tiny(GetParam().spec);
    dsv4::write_folder(dir_, tiny_);
  }
  Expected expected(const dsv4::Reference& ref, int64_t n) const {
    Expected e;
    e.ids = prompt(n, ref.config().vocab_size);
    e.greedy = ref.greedy(e.ids, kNewTokens);
    e.seq = e.ids;
    e.seq.insert(e.seq.end(), e.greedy.begin(), e.greedy.end());
    e.logits = ref.logits(e.seq);
    // Each top-k decided by the scores, not by a tie rule (see NoTopKDecidedByATie).
    EXPECT_EQ(ref.stats().indexer_ties, 0);
    EXPECT_EQ(ref.stats().router_ties, 0);
    // And each greedy pick by more than twice the tolerance, so that an engine within the
    // tolerance must pick the same id.
    const int64_t V = ref.config().vocab_size;
    for (int64_t i = 0; i < kNewTokens; ++i) {
      dsv4::Vec row(e.logits.begin() + (n - 1 + i) * V, e.logits.begin() + (n + i) * V);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<>());
      EXPECT_GT(row[0] - row[1], 2 * kTol) << "greedy step " << i;
    }
    return e;
  }
  ScratchDir scratch_{"dsv4ref"};
  std::string dir_ = scratch_.file("model");
  dsv4::Tiny tiny_;
};

TEST_P(DeepseekV4, EngineLogitsAndGreedyIdsEqualTheReference) {
  const dsv4::Reference ref(tiny_.config, tiny_.weights);
  const int64_t V = ref.config().vocab_size;
  LoadedModel lm = load_model(dir_);
  const Model& model = *lm.model;
  ASSERT_EQ(model.config().vocab_size, V);
  for (const int64_t n : {13, 16, 21}) {
    SCOPED_TRACE("prompt of " + std::to_string(n) + " tokens");
    const Expected e = expected(ref, n);
    const std::string tag = "n" + std::to_string(n) + "_";
    {  // one no-cache forward over prompt + continuation, every position
      Forward fwd(model, "eager", static_cast<int64_t>(e.seq.size()));
      ForwardParams p;
      p.tokens = e.seq.data();
      p.n_tokens = static_cast<int64_t>(e.seq.size());
      p.logits = LogitsMode::kAll;
      expect_close(tag + "no_cache_forward", fwd.forward(p), e.logits, V);
    }
    const std::string refusal = paged_refusal(model);
    if (!refusal.empty()) RecordProperty("paged_skipped", refusal);
    for (const std::string cache : {"dynamic", "paged"}) {
      if (cache == "paged" && !refusal.empty()) continue;
      SessionConfig sc;
      sc.cache.implementation = cache;
      sc.cache.max_cache_len = 64;
      sc.cache.kv_dtype = DType::kF32;
      sc.cache.paged.block_tokens = 4;
      {  // the prompt in one forward, then the reference's continuation token by token: the
         // logits of every generated step (windows close during decode)
        Session s(model, sc);
        const std::span<const float> pre = s.forward_all(e.ids);
        std::vector<float> got(pre.begin(), pre.end());
        for (int64_t i = 0; i < kNewTokens; ++i) {
          const std::span<const float> l = s.decode(e.greedy[static_cast<size_t>(i)]);
          got.insert(got.end(), l.begin(), l.end());
        }
        expect_close(tag + cache + "_prefill_then_decode", got, e.logits, V);
      }
      {  // everything token by token: every window emitted by a decode step
        Session s(model, sc);
        std::vector<float> got;
        for (int32_t id : e.seq) {
          const std::span<const float> l = s.decode(id);
          got.insert(got.end(), l.begin(), l.end());
        }
        expect_close(tag + cache + "_token_by_token", got, e.logits, V);
      }
      for (const bool chunked : {false, true}) {  // greedy, whole / chunked (5) prefill
        SessionConfig gc = sc;
        if (chunked) gc.prefill_chunk = 5;
        Session s(model, gc);
        GenerateParams gp;
        gp.max_new_tokens = kNewTokens;
        gp.ignore_eos = true;
        std::vector<int32_t> got;
        generate(s, e.ids, gp, nullptr, &got);
        EXPECT_EQ(got, e.greedy) << cache << " greedy ids, chunked prefill " << chunked;
      }
    }
  }
}

TEST_P(DeepseekV4, CliGenerateEqualsTheReference) {
  const dsv4::Reference ref(tiny_.config, tiny_.weights);
  const Expected e = expected(ref, 21);
  const std::string model =
      " --model " + testing_util::shell_quote(dir_) + " --prompt-ids '" + ids_text(e.ids) + "'";
  const bool paged = paged_refusal(*load_model(dir_).model).empty();
  for (const std::string extra : {"", " --cache paged --block-tokens 4"}) {
    if (!paged && !extra.empty()) continue;
    const testing_util::CliResult r =
        testing_util::run_cli("generate" + model + " -n " + std::to_string(kNewTokens) +
                              " --temp 0 --ignore-eos --output ids --kv-dtype f32" + extra);
    ASSERT_EQ(r.exit_code, 0) << extra << "\n" << r.err;
    EXPECT_EQ(r.out, ids_text(e.greedy) + "\n") << "kvcache generate" << extra;
  }
}

// Through the paged engine (continuous batching): two requests at once, prompts of 13 and 21
// tokens, each step's chosen logprob against the reference's log-softmax.
TEST_P(DeepseekV4, PagedEngineEqualsTheReference) {
  const dsv4::Reference ref(tiny_.config, tiny_.weights);
  const int64_t V = ref.config().vocab_size;
  LoadedModel lm = load_model(dir_);
  if (const std::string refusal = paged_refusal(*lm.model); !refusal.empty())
    GTEST_SKIP() << refusal;
  EngineConfig c;
  c.cache.max_cache_len = 256;
  c.cache.kv_dtype = DType::kF32;
  c.cache.paged.block_tokens = 4;
  c.max_running = 4;
  c.kernel = "eager";
  Engine engine(*lm.model, nullptr, c);
  std::vector<Expected> want = {expected(ref, 13), expected(ref, 21)};
  std::vector<RequestOutput> outs(want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    RequestParams rp;
    rp.prompt = want[r].ids;
    rp.max_tokens = kNewTokens;
    rp.logprobs = 1;
    engine.submit(rp, [&outs, r](const StreamEvent& ev) {
      if (ev.output != nullptr) outs[r] = *ev.output;
    });
  }
  while (engine.has_work()) engine.step();
  for (size_t r = 0; r < want.size(); ++r) {
    const Expected& e = want[r];
    ASSERT_EQ(outs[r].samples.size(), 1u);
    const auto& toks = outs[r].samples[0].tokens;
    EXPECT_EQ(std::vector<int32_t>(toks.begin(), toks.end()), e.greedy) << "request " << r;
    double worst = 0;
    const int64_t n = static_cast<int64_t>(e.ids.size());
    for (int64_t i = 0; i < kNewTokens && i < static_cast<int64_t>(toks.size()); ++i) {
      const auto row = e.logits.begin() + (n - 1 + i) * V;
      const double mx = *std::max_element(row, row + V);
      double sum = 0;
      for (auto it = row; it != row + V; ++it) sum += std::exp(*it - mx);
      const double want_lp = row[e.greedy[static_cast<size_t>(i)]] - mx - std::log(sum);
      worst = std::max(
          worst, std::fabs(outs[r].samples[0].logprobs.at(static_cast<size_t>(i)).chosen.logprob -
                           want_lp));
    }
    RecordProperty("paged_engine_logprob_max_abs_diff_" + std::to_string(r), std::to_string(worst));
    EXPECT_LE(worst, kTol) << "request " << r;
  }
}

// The runtime's own preset (dummy:deepseekv4-tiny, src/model/dummy.cc) read by the reference
// as any Hugging Face folder: the preset writer's shapes and tensor names.
TEST(DeepseekV4DummyPreset, EngineEqualsTheReference) {
  const ScratchDir scratch("dsv4ref_dummy");
  DummyModelOptions o;
  o.preset = "deepseekv4-tiny";
  o.weight_dtype = DType::kF32;
  o.seed = 5;
  o.cache_dir = scratch.file("cache");
  const std::string dir = build_dummy_model(o);
  auto [config, weights] = dsv4::load_folder(dir);
  const dsv4::Reference ref(config, std::move(weights));
  const int64_t V = ref.config().vocab_size;
  const std::vector<int32_t> ids = prompt(21, V);
  const std::vector<int32_t> want_ids = ref.greedy(ids, kNewTokens);
  std::vector<int32_t> seq = ids;
  seq.insert(seq.end(), want_ids.begin(), want_ids.end());
  const dsv4::Vec want = ref.logits(seq);
  double spread = 0;
  for (double x : want) spread = std::max(spread, std::fabs(x));
  EXPECT_GT(spread, 0.05) << "degenerate logits would make the comparison meaningless";
  // The preset's 2 indexer heads give exact-zero indexer scores (ReLU) often enough that some
  // top-k picks are decided by a tie: the engine and this reference both take the lower entry,
  // torch.topk leaves it unspecified, so these picks are recorded rather than held to 0.
  RecordProperty("dummy_indexer_ties", std::to_string(ref.stats().indexer_ties));
  LoadedModel lm = load_model(dir);
  SessionConfig sc;
  sc.cache.max_cache_len = 64;
  sc.cache.kv_dtype = DType::kF32;
  Session s(lm.model.operator*(), sc);
  std::vector<float> got;
  for (int32_t id : seq) {
    const std::span<const float> l = s.decode(id);
    got.insert(got.end(), l.begin(), l.end());
  }
  expect_close("dummy_dynamic_token_by_token", got, want, V);
  Session g(*lm.model, sc);
  GenerateParams gp;
  gp.max_new_tokens = kNewTokens;
  gp.ignore_eos = true;
  std::vector<int32_t> ids_out;
  generate(g, ids, gp, nullptr, &ids_out);
  EXPECT_EQ(ids_out, want_ids);
}

INSTANTIATE_TEST_SUITE_P(Folders, DeepseekV4, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace kvcache
