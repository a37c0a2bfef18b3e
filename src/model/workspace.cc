#include "model/workspace.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/gemm_packed.h"
#include "kernels/matmul.h"

namespace kvcache {

namespace {

// Floats of the prefill GEMM's packed input for `rows` rows, sized for the widest input of any
// linear (none for fewer rows than the GEMM takes: the GEMV path serves them).
int64_t packed_input_floats(const ModelConfig& c, std::span<const ScratchKind* const> kinds,
                            int64_t rows) {
  if (rows < kBlasMinRows) return 0;
  int64_t k = 0;
  for (const ScratchKind* kind : kinds) k = std::max(k, kind->widest_input(c));
  return static_cast<int64_t>(gemm_packed_scratch_floats(rows, k));
}

int64_t floats(const ScratchBuffer& b, int64_t rows) {
  return rows * b.per_row + b.fixed;
}

}  // namespace

Workspace::Workspace(const ModelConfig& config, std::vector<const ScratchKind*> kinds)
    : config_(config) {
  for (const ScratchKind* kind : kinds) {
    std::vector<ScratchBuffer> plan = kind->buffers(config);
    parts_.push_back({kind, plan, std::vector<Tensor>(plan.size())});
  }
}

void Workspace::reserve(int64_t rows) {
  if (rows <= rows_) return;
  for (Part& part : parts_)
    for (size_t i = 0; i < part.plan.size(); ++i)
      if (const int64_t n = floats(part.plan[i], rows); n > 0)
        part.buffers[i] = Tensor::empty(DType::kF32, {n});
  std::vector<const ScratchKind*> kinds;
  for (const Part& part : parts_) kinds.push_back(part.kind);
  if (const int64_t pf = packed_input_floats(config_, kinds, rows); pf > 0)
    pack_ = Tensor::empty(DType::kF32, {pf});
  rows_ = rows;
}

Tensor& Workspace::tensor(const ScratchKind& kind, size_t i) {
  for (Part& part : parts_)
    if (part.kind == &kind) return part.buffers[i];
  KV_CHECK(false, std::string("the model's family lists no scratch of kind ") + kind.name);
  return pack_;
}

float* Workspace::grow(const ScratchKind& kind, size_t i, int64_t n) {
  Tensor& t = tensor(kind, i);
  if (t.numel() < n) t = Tensor::empty(DType::kF32, {std::max(n, 2 * t.numel())});
  return t.data_as<float>();
}

size_t Workspace::bytes() const {
  size_t n = pack_.size_bytes();
  for (const Part& part : parts_)
    for (const Tensor& t : part.buffers) n += t.size_bytes();
  return n;
}

size_t Workspace::bytes_for(const ModelConfig& config, std::span<const ScratchKind* const> kinds,
                            int64_t rows) {
  int64_t n = packed_input_floats(config, kinds, rows);
  for (const ScratchKind* kind : kinds)
    for (const ScratchBuffer& b : kind->buffers(config)) n += floats(b, rows);
  return static_cast<size_t>(n) * sizeof(float);
}

}  // namespace kvcache
