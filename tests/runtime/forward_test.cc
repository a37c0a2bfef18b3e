// What Forward checks before it writes anything, and the family registry's refusal: a no-cache
// forward (the recompute container) that does not start at position 0, a cache built for
// another layer plan, an architecture no family serves.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/family.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"

namespace kvcache {
namespace {

std::string error_of(Forward& fwd, const ForwardParams& p) {
  try {
    fwd.forward(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Forward, WithoutACacheTheChunkStartsAtPositionZero) {
  const LoadedModel m = load_model("dummy:tiny");
  Forward fwd(*m.model, "fused", 8);
  const std::vector<int32_t> ids = {5, 6, 7};
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = 3;
  EXPECT_EQ(error_of(fwd, p), "no error");
  p.pos0 = 4;  // the recompute container holds this call's tokens only, at 0, 1, 2
  const std::string msg = error_of(fwd, p);
  EXPECT_NE(msg.find("recompute"), std::string::npos) << msg;
  EXPECT_NE(msg.find("end at position 7"), std::string::npos) << msg;
  p.pos0 = 0;
  EXPECT_EQ(error_of(fwd, p), "no error");  // the refused call left nothing behind
}

TEST(Forward, ACacheBuiltForAnotherLayerPlanIsRefusedBeforeAnyWrite) {
  const LoadedModel m = load_model("dummy:tiny");
  Forward fwd(*m.model, "fused", 8);
  const std::vector<int32_t> ids = {5, 6};
  ForwardParams p;
  p.tokens = ids.data();
  p.n_tokens = 2;
  CacheConfig cc = make_cache_config(m.model->config(), SessionConfig{});
  cc.layer_types.resize(1);
  Cache one_layer(cc);
  p.cache = &one_layer;
  EXPECT_NE(error_of(fwd, p).find("the cache has 1 layers for a model of 2"), std::string::npos);
  cc = make_cache_config(m.model->config(), SessionConfig{});
  cc.num_kv_shared_layers = 1;  // layer 1 would read layer 0
  Cache shared(cc);
  p.cache = &shared;
  const std::string msg = error_of(fwd, p);
  EXPECT_NE(msg.find("layer 1: the cache shares KV from layer 0"), std::string::npos) << msg;
  EXPECT_EQ(shared.seq_length(0), 0);
}

TEST(ModelFamilies, AnArchitectureNoFamilyServesIsRefusedNamingTheRegisteredOnes) {
  EXPECT_EQ(std::string(find_family("qwen2").name), "llama");
  EXPECT_EQ(std::string(find_family("deepseek_v2").name), "deepseek");
  try {
    find_family("olmo2");
    FAIL() << "olmo2 has no family";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    for (const char* arch : {"'olmo2'", "gemma3n", "gpt_oss", "llama", "mistral"})
      EXPECT_NE(msg.find(arch), std::string::npos) << arch << ": " << msg;
  }
}

}  // namespace
}  // namespace kvcache
