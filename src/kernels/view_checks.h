// Argument checks shared by the element-wise kernels that take f32 TensorViews with rows of
// unit stride (causal_conv1d, the gated delta rule, its gates, rms_norm_gated): every failure is
// an Error(kInvalidArgument) "<kernel>: <argument> ...", raised before anything is written.
#pragma once

#include <string>

#include "core/error.h"
#include "core/tensor.h"

namespace kvcache::view_checks {

[[noreturn]] inline void fail(const char* who, const std::string& msg) {
  throw Error(ErrorKind::kInvalidArgument, std::string(who) + ": " + msg);
}

// `name` is an f32 view of `ndim` dimensions whose innermost stride is 1, with data.
inline void require_f32_rows(const char* who, const char* name, const TensorView& t, int ndim) {
  if (t.ndim() != ndim) {
    fail(who,
         std::string(name) + " must be " + std::to_string(ndim) + "-d, got " + t.shape().str());
  }
  if (t.dtype() != DType::kF32)
    fail(who, std::string(name) + " must be f32, got " + dtype_name(t.dtype()));
  if (t.dim(ndim - 1) > 1 && t.stride(ndim - 1) != 1)
    fail(who, std::string(name) + ": the innermost stride must be 1");
  if (t.data() == nullptr && t.numel() > 0) fail(who, std::string(name) + " has no data");
}

inline void require_shape(const char* who, const char* name, const TensorView& t,
                          const Shape& want) {
  if (!(t.shape() == want))
    fail(who, std::string(name) + " must be " + want.str() + ", got " + t.shape().str());
}

}  // namespace kvcache::view_checks
