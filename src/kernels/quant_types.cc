#include "kernels/quant_types.h"

namespace kvcache {

const QuantKernels* quant_kernels(DType t) {
  if (const QuantKernels* k = legacy_quant_kernels(t)) return k;
  return k_quant_kernels(t);
}

}  // namespace kvcache
