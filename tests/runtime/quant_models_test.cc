// dummy:tiny in each legacy GGUF quantisation (q4_0, q4_1, q5_0, q5_1, iq4_nl) against its f32
// twin: the same GGUF with every quantised matrix replaced by its dequantized values. The
// quantised model reads its blocks in place (the integer dot on decode, the GEMM's widening on
// prefill) and, where the build has the integer dot (AVX2), multiplies x rounded to int8 per 32
// as llama.cpp does (kernels/matmul.h); the twin multiplies f32 x. So their logits differ by
// that rounding of x (and summation order without it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/matmul.h"
#include "kernels/quant_types.h"
#include "model/dummy.h"
#include "model/gguf.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

// Writes `path`: the GGUF at `src` with every tensor of type `t` dequantized to f32.
void write_f32_twin(const std::string& src, DType t, const std::string& path) {
  const auto g = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [key, value] : g->metadata()) w.set(key, value);
  std::deque<std::vector<float>> keep;  // the f32 data, alive until write()
  int converted = 0;
  for (const GgufTensorInfo& info : g->tensor_infos()) {
    const TensorView v = g->tensor_view(info);
    if (v.dtype() != t) {
      w.add_tensor(info.name, v);
      continue;
    }
    keep.emplace_back(static_cast<size_t>(v.numel()));
    dequantize_row(v.data(), t, keep.back().data(), v.numel());
    w.add_tensor(info.name, TensorView(keep.back().data(), DType::kF32, v.shape()));
    ++converted;
  }
  ASSERT_GT(converted, 0) << src << " has no " << dtype_name(t) << " tensor";
  w.write(path);
}

TEST(QuantModels, LegacyTypesMatchTheirDequantizedF32Twin) {
  const testing_util::ScratchDir dir("quant_models");
  for (DType t : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL}) {
    DummyModelOptions d;
    d.cache_dir = dir.str();
    d.weight_dtype = t;
    const std::string qpath = build_dummy_gguf(d);
    const std::string fpath = dir.str() + "/twin-" + dtype_name(t) + ".gguf";
    write_f32_twin(qpath, t, fpath);
    const LoadedModel q = load_model(qpath);
    const LoadedModel f = load_model(fpath);
    ASSERT_EQ(q.model->file().tensor("blk.1.ffn_up.weight").dtype(), t);
    ASSERT_EQ(f.model->file().tensor("blk.1.ffn_up.weight").dtype(), DType::kF32);
    Session sq(*q.model, SessionConfig{});
    Session sf(*f.model, SessionConfig{});
    // A prefill of 7 tokens (the GEMM path), then 6 decode steps (the GEMV's fused dot), fed
    // the twin's greedy tokens.
    std::vector<int32_t> ids = {1, 15043, 3186, 29892, 920, 526, 366};
    std::vector<float> lq, lf;
    {
      const auto a = sq.prefill(ids);
      const auto b = sf.prefill(ids);
      lq.assign(a.begin(), a.end());
      lf.assign(b.begin(), b.end());
    }
    for (int step = 0; step <= 6; ++step) {
      ASSERT_EQ(lq.size(), lf.size());
      float scale = 0.0f, diff = 0.0f;
      for (size_t i = 0; i < lf.size(); ++i) {
        scale = std::max(scale, std::fabs(lf[i]));
        diff = std::max(diff, std::fabs(lq[i] - lf[i]));
      }
      ASSERT_GT(scale, 0.0f);
      // Measured, as the largest |difference| over the largest |logit|: with x rounded per 32
      // (AVX2 builds), 3.1e-3 .. 4.8e-3 over the 5 types and 7 steps (worst: q5_0 4.8e-3,
      // q4_1 4.5e-3, q5_1 4.0e-3, q4_0 3.9e-3, iq4_nl 3.8e-3), the rounding of x (up to
      // amax / 254 per block of 32) through 2 layers; f32 x alone (builds without the
      // integer dot) about 2e-7. A misread block is far above either bound: the fifth bits of
      // the wrong qh bytes (a deliberate bug) gave 0.6 .. 0.9 for q5_0 and q5_1.
      const float bound = quant_kernels(t)->dot_q8_32 != nullptr ? 1e-2f : 1e-5f;
      EXPECT_LE(diff, bound * scale) << dtype_name(t) << " step " << step;
      if (step == 6) break;
      const int32_t next =
          static_cast<int32_t>(std::max_element(lf.begin(), lf.end()) - lf.begin());
      const auto a = sq.decode(next);
      const auto b = sf.decode(next);
      lq.assign(a.begin(), a.end());
      lf.assign(b.begin(), b.end());
    }
  }
}

}  // namespace
}  // namespace kvcache
