// The families beyond plain GQA on the paged cache (cache/paged_store.h): Gemma-2 (mixed
// sliding/full groups, softcaps), GPT-OSS (sinks, sliding), Gemma-3n (KV-shared layers own no
// pages), DeepSeek-V2/V3 MLA (latent c_kv in the K pages, rotated key k_rot in the V pages: two
// one-head tensors of different widths).
//   - paged equals dense bit for bit with the eager kernel (same arithmetic on the same keys),
//     one sequence and a varlen batch of rows at different positions;
//   - a prefix-cache hit equals a cold run;
//   - the pages and the blocks in use equal the notes' per-token formulas times the allocated
//     slots, exactly (block rounding stated per group);
//   - combinations that do not apply are refused when the cache is built, naming the layer,
//     its type and what to use instead.
// Paged vs the no-cache reference forward (1e-5, eager and fused): families_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "core/error.h"
#include "family_presets.h"
#include "golden_util.h"
#include "model/dummy.h"
#include "model/model_file.h"
#include "paged_compare.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

namespace fs = std::filesystem;
using testing_util::bits_equal;

std::unique_ptr<Model> load_preset(const std::string& preset) {
  static const std::string dir = testing_util::process_scratch().file("families_paged");
  DummyModelOptions o;
  o.preset = preset;
  o.weight_dtype = DType::kF32;
  o.seed = 3;
  o.cache_dir = dir;
  return std::make_unique<Model>(open_model_file(build_dummy_model(o)));
}

std::vector<int32_t> prompt(int64_t n, int32_t vocab, int32_t salt = 11) {
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + salt) % vocab));
  return ids;
}

SessionConfig config_of(const char* cache, const char* kernel) {
  SessionConfig sc;
  sc.cache.implementation = cache;
  sc.kernel = kernel;
  sc.cache.max_cache_len = 64;
  sc.prefill_chunk = 5;
  sc.cache.paged.block_tokens = 3;  // chunks, windows (8) and blocks all straddle each other
  return sc;
}

class PagedFamilies : public ::testing::TestWithParam<std::string> {};

// One sequence: chunked prefill then decode past every window, dense and paged side by side.
// Sliding layers: the dense window container hands the kernel only the last W−1+S keys (from
// kv_offset), the paged group every position with the out-of-window blocks replaced by the
// zero null block and masked — the eager kernel skips masked keys, so the sums are the same.
TEST_P(PagedFamilies, PagedEqualsDenseBitForBit) {
  const auto model = load_preset(GetParam());
  const std::vector<int32_t> ids = prompt(26, static_cast<int32_t>(model->config().vocab_size));
  Session dense(*model, config_of("dynamic", "eager")), paged(*model, config_of("paged", "eager"));
  ASSERT_NE(paged.paged_store(), nullptr);
  const size_t split = 13;
  std::vector<float> want;
  {
    const auto d = dense.prefill({ids.data(), split});
    want.assign(d.begin(), d.end());
  }
  EXPECT_TRUE(bits_equal(paged.prefill({ids.data(), split}), want)) << GetParam() << " prefill";
  for (size_t i = split; i < ids.size(); ++i) {
    const auto d = dense.decode(ids[i]);
    want.assign(d.begin(), d.end());
    const auto got = paged.decode(ids[i]);
    EXPECT_TRUE(bits_equal(got, want))
        << GetParam() << " token " << i << " rel " << max_rel_diff(got, want);
  }
  EXPECT_EQ(paged.paged_store()->check_invariants(), "");
}

// A varlen batch through one store: each sequence prefilled alone, then three rows at
// different positions decoded in one forward (B = 3, below the sgemm threshold: every
// projection row is the same GEMV as for B = 1), against dense sessions run one by one.
TEST_P(PagedFamilies, VarlenBatchEqualsDenseRunsAlone) {
  const auto model = load_preset(GetParam());
  const auto vocab = static_cast<int32_t>(model->config().vocab_size);
  const std::vector<int64_t> lens = {5, 12, 9};
  testing_util::PagedVsDense c;
  for (size_t i = 0; i < lens.size(); ++i)
    c.prompts.push_back(prompt(lens[i], vocab, static_cast<int32_t>(5 + 7 * i)));
  c.decode_steps = 6;
  c.dense = config_of("dynamic", "eager");
  c.dense.prefill_chunk = 64;  // one forward per prompt, like the paged prefill
  c.paged = config_of("paged", "eager");
  c.note = " (" + GetParam() + ")";
  testing_util::expect_paged_equals_dense(*model, c);
}

// A second request sharing the first one's prompt attaches its full blocks (every group must
// hold them) and computes only the tail; its logits equal a cold run's (1e-5: the tail's
// projections run with a different row count, so BLAS may round differently).
TEST_P(PagedFamilies, PrefixHitEqualsColdRun) {
  const auto model = load_preset(GetParam());
  const std::vector<int32_t> ids = prompt(20, static_cast<int32_t>(model->config().vocab_size));
  SessionConfig sc = config_of("paged", "eager");
  sc.prefill_chunk = 64;
  Session s(*model, sc);
  std::vector<float> cold;
  {
    const auto l = s.prefill(ids);
    cold.assign(l.begin(), l.end());
  }
  s.reset();  // blocks stay in the prefix index
  const int64_t hit = s.reuse_prefix(ids);
  // Every group must serve the hit: full groups keep every block; a sliding group (W = 8)
  // needs the blocks of the last W − 1 positions before the hit, which stay cached too.
  // 19 tokens may be reused (the last is computed): 6 blocks of 3 shared, and the first token
  // of the kept partial block [18, 20) copied.
  EXPECT_EQ(hit, 19) << GetParam();
  const auto warm = s.prefill({ids.data() + hit, ids.size() - static_cast<size_t>(hit)});
  EXPECT_LE(max_rel_diff(warm, cold), 1e-5) << GetParam();
  EXPECT_EQ(s.paged_store()->check_invariants(), "");
}

// Bytes per token of one storing layer: H_kv · (D_k + D_v) · b — GQA 2·H_kv·d_h·b, MLA
// (d_c + d_r)·b (one head each, no factor 2).
int64_t layer_bytes_per_token(const ModelConfig& c, int64_t b) {
  return c.mla.enabled() ? (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) * b
                         : 2 * c.n_kv_heads * c.head_dim * b;
}

// The pages equal blocks · block_tokens · the notes' per-token formula, and after S tokens the
// blocks in use are, per group (bt tokens per block, W the window):
//   full:    ceil(S / bt)                                          (one partial block at most)
//   sliding: ceil(S / bt) − floor(max(0, S − W + 1) / bt) + 1       (the W − 1 visible positions'
//            blocks, plus the group's null block)
// so for a full-attention-only model (MLA) used bytes = L·(d_c + d_r)·b · (S + pad), pad the
// free slots of the last block (< bt). KV-shared layers (Gemma-3n) own no pages.
TEST_P(PagedFamilies, KvBytesPerBlockEqualTheNotesFormulas) {
  const auto model = load_preset(GetParam());
  const ModelConfig& c = model->config();
  const int64_t b = 4, bt = 4, M = 20, e = layer_bytes_per_token(c, b);
  const int64_t L_store = c.n_layers - c.num_kv_shared_layers;
  SessionConfig sc = config_of("paged", "fused");
  sc.cache.paged.block_tokens = bt;
  sc.cache.max_cache_len = M;
  Session s(*model, sc);
  const PagedKVStore& store = *s.paged_store();
  int64_t pages = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const bool owns = l < L_store;
    pages += static_cast<int64_t>(store.layer_page_bytes(l));
    if (!owns) {
      EXPECT_EQ(store.layer_page_bytes(l), 0u) << GetParam() << " shared layer " << l;
    }
  }
  int64_t want_pages = 0;
  for (int g = 0; g < store.num_groups(); ++g) {
    const PagedGroup& grp = store.group(g);
    int64_t owners = 0;
    for (int l : grp.layers) owners += l < L_store ? 1 : 0;
    const int64_t blocks = grp.kind == GroupKind::kSliding ? M / bt + 1 : M / bt;  // + null block
    want_pages += blocks * bt * owners * e;
    EXPECT_EQ(static_cast<int64_t>(store.stats(g).block_bytes), bt * owners * e)
        << GetParam() << " group " << g;
  }
  EXPECT_EQ(pages, want_pages) << GetParam();
  EXPECT_EQ(s.kv_bytes(), store.bytes()) << GetParam();  // the leader layer counts the tables once

  for (const int64_t S : {int64_t{6}, int64_t{13}, int64_t{19}}) {
    s.reset();
    s.prefill(prompt(S, static_cast<int32_t>(c.vocab_size)));
    int64_t want_used = 0;
    for (int g = 0; g < store.num_groups(); ++g) {
      const PagedGroup& grp = store.group(g);
      int64_t owners = 0;
      for (int l : grp.layers) owners += l < L_store ? 1 : 0;
      const int64_t full_blocks = (S + bt - 1) / bt;
      const int64_t blocks = grp.kind == GroupKind::kSliding
                                 ? full_blocks - std::max<int64_t>(0, S - grp.window + 1) / bt + 1
                                 : full_blocks;
      want_used += blocks * bt * owners * e;
    }
    EXPECT_EQ(static_cast<int64_t>(store.used_bytes()), want_used) << GetParam() << " S=" << S;
    if (c.mla.enabled()) {
      const int64_t pad = (bt - S % bt) % bt;
      EXPECT_EQ(static_cast<int64_t>(store.used_bytes()),
                c.n_layers * (c.mla.kv_lora_rank + c.mla.qk_rope_head_dim) * b * (S + pad))
          << "L·(d_c + d_r)·b per token plus the last block's " << pad << " free slots, S=" << S;
    }
  }
}

// The serving engine (continuous batching over the paged store) on each family: requests
// run together — rows at different positions in one decode forward, chunked prefills beside
// decodes — give the tokens each gives alone (the engine's batch-invariant linears make that
// exact), and the first request's tokens are the dense session's greedy ones.
TEST_P(PagedFamilies, EngineBatchEqualsEachRequestAlone) {
  const auto model = load_preset(GetParam());
  const int32_t vocab = static_cast<int32_t>(model->config().vocab_size);
  EngineConfig ec;
  ec.kernel = "eager";
  ec.cache.paged.block_tokens = 4;
  ec.cache.max_cache_len = 256;
  ec.max_tokens_per_step = 16;  // prompts of 11 and 19 tokens prefill in chunks beside decodes
  std::vector<RequestParams> reqs;
  for (const int64_t n : {int64_t{11}, int64_t{19}, int64_t{6}}) {
    RequestParams rp;
    rp.prompt = prompt(n, vocab, static_cast<int32_t>(n));
    rp.max_tokens = 9;
    reqs.push_back(rp);
  }
  auto run = [&](const std::vector<RequestParams>& rs) {
    Engine e(*model, nullptr, ec);
    std::vector<std::vector<int32_t>> out(rs.size());
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < rs.size(); ++i)
      ids.push_back(e.submit(rs[i], [&out, i](const StreamEvent& ev) {
        if (ev.output != nullptr) out[i] = ev.output->samples.at(0).tokens;
      }));
    while (e.has_work()) {
      e.step();
      EXPECT_EQ(e.check_invariants(), "");
    }
    return out;
  };
  const auto together = run(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i], run({reqs[i]})[0]) << GetParam() << " request " << i;
    EXPECT_EQ(together[i].size(), 9u);
  }
  Session s(*model, config_of("dynamic", "eager"));
  auto l = s.prefill(reqs[0].prompt);
  std::vector<int32_t> greedy;
  for (int t = 0; t < 9; ++t) {
    greedy.push_back(testing_util::argmax_id(l));
    l = s.decode(greedy.back());
  }
  EXPECT_EQ(together[0], greedy) << GetParam();
}

INSTANTIATE_TEST_SUITE_P(Presets, PagedFamilies,
                         ::testing::ValuesIn(testing_util::family_presets()),
                         testing_util::preset_test_name);

std::string construction_error(const Model& model, const SessionConfig& sc) {
  try {
    Session s(model, sc);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// MLA's latent: the dense quantized container stores it (KIVI on c_kv and k_rot, issue 43 item
// 4), the paged store's quantized pages do not (they hold per-head K/V): refused when the cache
// is built, naming MLA.
TEST(PagedFamiliesRefusals, MlaLatentsQuantizeInTheDenseContainerNotInPages) {
  const auto model = load_preset("mla-tiny");
  EXPECT_EQ(construction_error(*model, config_of("quantized", "fused")), "no error");
  SessionConfig sc = config_of("paged", "fused");
  sc.cache.paged.quant = PagedQuantFormat{};
  const std::string msg = construction_error(*model, sc);
  EXPECT_NE(msg.find("MLA"), std::string::npos) << msg;
}

// Chunked layers (Llama-4) have no paged group: refused at construction, with the way out.
TEST(PagedFamiliesRefusals, ChunkedLayersOnThePagedCacheAreRefusedAtConstruction) {
  DummyModelOptions o;
  o.preset = "gemma2-tiny";
  o.weight_dtype = DType::kF32;
  o.cache_dir = testing_util::process_scratch().file("families_paged");
  std::unique_ptr<ModelFile> file = open_model_file(build_dummy_model(o));
  file->mutable_config().layer_types = {"full_attention", "chunked_attention", "sliding_attention",
                                        "full_attention"};
  file->mutable_config().attention_chunk_size = 6;
  const Model model(std::move(file));
  const std::string msg = construction_error(model, config_of("paged", "fused"));
  EXPECT_NE(msg.find("layer 1 has type 'chunked_attention'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use the dynamic or static cache"), std::string::npos) << msg;
  EXPECT_EQ(construction_error(model, config_of("dynamic", "fused")), "no error");
}

}  // namespace
}  // namespace kvcache
