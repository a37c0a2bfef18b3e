// q4_0, q4_1, q5_0, q5_1 and iq4_nl: ggml's blocks of 32 (kernels/quant_types.h).
#include "kernels/quant_types.h"

namespace kvcache {

const QuantKernels* legacy_quant_kernels(DType) {
  return nullptr;
}

}  // namespace kvcache
