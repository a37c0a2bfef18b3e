// Double-precision attention reference for tests: plain loops over the definition, visibility
// written out from the option fields (independent of mask.h's interval logic), no tiling, no
// online softmax. Slow on purpose; the tolerance tables in docs/architecture.md are against it.
#pragma once

#include <vector>

#include "kernels/attention.h"

namespace kvcache {

struct ReferenceResult {
  std::vector<double> out;    // [B, H_q, S_q, D_v] contiguous
  std::vector<double> probs;  // [B, H_q, S_q, S_kv] contiguous (sink excluded from columns)
};

// Same arguments and meaning as an AttentionFn (out and weights_out are ignored). K/V are read
// at their dtype and widened exactly to double.
ReferenceResult attention_reference(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const AttentionOptions& options);

}  // namespace kvcache
