#include "model/weights.h"

#include <algorithm>

#include "core/error.h"

namespace kvcache {

TensorView Weights::matrix(const std::string& name) const {
  const TensorView& t = file_.tensor(name);
  const int64_t be = dtype_info(t.dtype()).block_elems;
  if (t.ndim() >= 2 && be > 1 && t.dim(t.ndim() - 1) % be != 0) {
    throw Error(ErrorKind::kFormat, file_.path() + ": tensor '" + name + "' is " +
                                        dtype_name(t.dtype()) + " with a row length not a " +
                                        "multiple of its block (" + std::to_string(be) + ")");
  }
  return t;
}

std::vector<float> Weights::read(const std::string& name) const {
  const TensorView& t = file_.tensor(name);
  std::vector<float> out(static_cast<size_t>(t.numel()));
  convert_n(t.data(), t.dtype(), out.data(), DType::kF32, out.size());
  return out;
}

const float* Weights::keep(std::vector<float> values) {
  Tensor c = Tensor::empty(DType::kF32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), c.data_as<float>());
  kept_.push_back(std::move(c));
  return kept_.back().data_as<const float>();
}

TensorView Weights::keep(Tensor tensor) {
  kept_.push_back(std::move(tensor));
  return kept_.back().view();
}

const float* Weights::vector(const std::string& name) {
  const TensorView& t = file_.tensor(name);
  if (t.dtype() == DType::kF32) return t.data_as<const float>();
  return keep(read(name));
}

const float* Weights::norm(const std::string& name) {
  if (!config().norm_add_one) return vector(name);
  // Gemma2RMSNorm: output * (1.0 + weight.float()), the sum taken in float.
  std::vector<float> w = read(name);
  for (float& x : w) x = 1.0f + x;
  return keep(std::move(w));
}

}  // namespace kvcache
