// model_fingerprint: equal for the same file opened twice, different for another seed (same
// architecture and shapes, other weights), another preset, or another weight dtype.
#include "model/fingerprint.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "model/dummy.h"
#include "model/model.h"
#include "model/model_file.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

Digest128 fingerprint_of(const std::string& path) {
  Model model(open_model_file(path));
  return model_fingerprint(model);
}

TEST(ModelFingerprint, StableForOneFileAndChangedByWeightsPresetAndDtype) {
  testing_util::ScratchDir dir("fingerprint");
  DummyModelOptions o;
  o.cache_dir = dir.str();
  const std::string a = build_dummy_model(o);
  const Digest128 fa = fingerprint_of(a);
  EXPECT_EQ(fingerprint_of(a), fa);

  DummyModelOptions seed = o;
  seed.seed = 1;
  EXPECT_NE(fingerprint_of(build_dummy_model(seed)), fa);

  DummyModelOptions dtype = o;
  dtype.weight_dtype = DType::kF32;
  EXPECT_NE(fingerprint_of(build_dummy_model(dtype)), fa);

  DummyModelOptions preset = o;
  preset.preset = "gemma2-tiny";
  EXPECT_NE(fingerprint_of(build_dummy_model(preset)), fa);
}

}  // namespace
}  // namespace kvcache
