// From a model step's inputs (a 2-D attention mask, position ids, the layer types) to the masks
// the attention kernels take, as transformers v5 builds them (masking_utils.py:
// find_packed_sequence_indices, flash_attention_mask, _ignore_causal_mask_sdpa,
// create_masks_for_generate and LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING).
// Masks here are descriptions (MaskSpec + geometry + the small per-row arrays they point to),
// never S_q x S_kv tensors unless materialize() is asked for. Each PatternMask owns its arrays.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"
#include "kernels/mask.h"

namespace kvcache {

// transformers' 2-D attention_mask: [batch, cols] row-major, nonzero = a real token, 0 = padding;
// column j is absolute position j (cols = tokens seen so far + this step's queries).
// Borrowed: the caller keeps `data` alive while the call runs.
struct AttentionMask2D {
  const uint8_t* data = nullptr;  // [batch, cols], or nullptr: no mask
  int64_t batch = 0, cols = 0;
  explicit operator bool() const { return data != nullptr; }
  bool at(int64_t b, int64_t j) const { return data[b * cols + j] != 0; }
};

// Packed sequences from position ids (v5 find_packed_sequence_indices): within a row a token
// whose position is not the previous one + 1 (a reset to 0, or any jump) starts a new
// sequence; ids count from 0 per row. position_ids is [batch, len] row-major. Returns the ids
// [batch, len], or nullopt when every row holds a single sequence (nothing to mask).
std::optional<std::vector<int32_t>> find_packed_sequence_indices(const int64_t* position_ids,
                                                                 int64_t batch, int64_t len);

// The flash-attention form of a padding mask (v5 flash_attention_mask): the last kv_length
// columns of the 2-D mask ([batch, min(kv_length, cols)], Python's mask[:, -kv_length:]), or
// nullopt when there is no mask or none of those columns is padding (the kernel then needs no
// mask, only causality). kv_length must be >= 1.
std::optional<std::vector<uint8_t>> flash_attention_mask(const AttentionMask2D& mask,
                                                         int64_t kv_length);

// v5 _ignore_causal_mask_sdpa: true when an SDPA-style kernel may drop the mask and rely on
// its is_causal flag: q_length == 1 or kv_length == q_length (the only cases where top-left and
// bottom-right alignment agree), the window/chunk (local_size > 0) longer than kv_length, and
// no padding among keys [kv_offset, kv_offset + kv_length) (columns past the mask's end count
// as padding, as v5's prepare_padding_mask pads with zeros). mask may be empty.
bool ignore_causal_mask_sdpa(const AttentionMask2D& mask, int64_t q_length, int64_t kv_length,
                             int64_t kv_offset, int64_t local_size);

// The mask patterns of v5's LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.
enum class MaskPattern { kFull, kSliding, kChunked };
const char* mask_pattern_name(MaskPattern p);  // "full", "sliding", "chunked"
// full_attention and deepseek_sparse_attention: kFull; sliding_attention,
// compressed_sparse_attention and heavily_compressed_attention: kSliding; chunked_attention:
// kChunked. nullopt for any other type (see create_masks_for_generate's error).
std::optional<MaskPattern> mask_pattern_for_layer_type(std::string_view layer_type);

// One mask: the description every kernel reads (AttentionOptions fields), with its arrays.
struct PatternMask {
  MaskPattern pattern = MaskPattern::kFull;
  MaskGeometry geometry;       // batch, q_len, kv_len, q_offset, kv_offset of the call
  int64_t sliding_window = 0;  // kSliding
  int64_t chunk_size = 0;      // kChunked
  // Padding as key intervals [kv_begin[b], kv_end[b]) (absolute); both empty: no padding.
  std::vector<int64_t> kv_begin, kv_end;  // [B]
  std::vector<int64_t> chunk_offset;      // [B] chunked rows' left padding; empty: all 0
  std::vector<int32_t> doc_ids;           // [B, doc_len] packed-sequence ids; empty: none
  int64_t doc_len = 0;
  bool all_visible = false;  // no (q, kv) pair of the geometry is masked: the mask can be skipped

  // The spec points into this object: valid while it lives and is not modified.
  MaskSpec spec() const;
  // Sets causal, sliding_window, chunk_size, chunk_offset, kv_valid_begin/end, doc_ids/doc_len,
  // q_offset and kv_offset (pointers into this object); leaves every other field alone.
  void apply(AttentionOptions* options) const;
  // The additive f32 mask [B, 1, S_q, S_kv] (0 or -inf), for eager-style kernels.
  Tensor materialize() const;
};

// Keys a layer's kernel call covers, as the cache reports them for the step (Cache::mask_sizes:
// transformers' get_mask_sizes).
struct KvExtent {
  int64_t kv_len = 0;
  int64_t kv_offset = 0;
};

struct GenerateMaskInputs {
  std::vector<std::string> layer_types;  // [layers] the config's layer_types
  int64_t batch = 1;
  int64_t q_len = 0;     // this step's query tokens
  int64_t past_len = 0;  // tokens the cache held before the step (absolute position of query 0)
  // [layers] from the cache; empty: no cache (v5: kv covers the attention mask's columns, or the
  // queries when there is no mask; past_len must then be 0).
  std::vector<KvExtent> kv_extents;
  AttentionMask2D attention_mask;  // optional; its batch must equal `batch`
  // [position_ids_batch, q_len] (position_ids_batch 1 or batch; 1 is broadcast), optional.
  // Packed sequences are detected from it only without an attention mask and without a cache,
  // as v5 does (a training-style packed batch).
  const int64_t* position_ids = nullptr;
  int64_t position_ids_batch = 1;
  int64_t sliding_window = 0;        // needed when a layer is sliding
  int64_t attention_chunk_size = 0;  // needed when a layer is chunked
};

struct GenerateMasks {
  std::vector<PatternMask> masks;  // one per distinct (pattern, geometry), in first-layer order
  std::vector<int> layer_mask;     // [layers] index into masks
  const PatternMask& for_layer(int layer) const { return masks.at(layer_mask.at(layer)); }
};

// v5 create_masks_for_generate: the masks of every layer type present, built once per step.
// Layers whose type maps to the same pattern and whose cache extents agree share one mask.
// Padding must be left and/or right padding (a run of real tokens per row); a gap inside a row
// throws Error(kInvalidArgument) naming the row. An unmapped layer type throws
// Error(kInvalidArgument) naming the layer and the type.
GenerateMasks create_masks_for_generate(const GenerateMaskInputs& in);

}  // namespace kvcache
