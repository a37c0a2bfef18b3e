// crop(n)'s rule, shared by every container so that they all read the argument the same way:
// transformers v5's Cache.crop / DynamicLayer.crop (cache_utils.py, "Remove `tokens_to_remove`
// tokens ... `crop(0)` will not necessarily always be a no-op, as it may still remove useless
// states"). Speculative decoding calls crop(-num_rejected); with nothing rejected that is
// crop(0), which must keep every token.
#pragma once

#include <cstdint>

namespace kvcache {

// The length a layer holding `seq_length` tokens keeps after crop(n):
//   n < 0: seq_length - |n|, at least 0 (removing more than is stored empties the layer);
//   n = 0: seq_length (nothing removed; a layer that records its past still shrinks back to
//          its working size, which is the container's business);
//   n > 0: the deprecated "keep the first n" form: min(n, seq_length). It warns once per
//          process on stderr (v5 warns too), the first time any container is given one.
int64_t crop_target_length(int64_t n, int64_t seq_length);

// Tests only: whether the deprecation warning has been printed, and forgetting that it was.
bool crop_deprecation_warned();
void reset_crop_deprecation_warning();

}  // namespace kvcache
