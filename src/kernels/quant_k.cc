// The k-quants q2_K, q3_K, q4_K, q5_K and q6_K: ggml's super-blocks of 256
// (kernels/quant_types.h).
#include "kernels/quant_types.h"

namespace kvcache {

const QuantKernels* k_quant_kernels(DType) {
  return nullptr;
}

}  // namespace kvcache
