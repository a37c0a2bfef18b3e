#include "kernels/mask_builder.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace kvcache {

namespace {

[[noreturn]] void bad(const std::string& who, const std::string& msg) {
  throw Error(ErrorKind::kInvalidArgument, who + ": " + msg);
}

// Columns [kv_offset, kv_offset + kv_length) of row b hold no padding (columns past the mask's
// end are padding: v5's prepare_padding_mask pads on the right with zeros).
bool row_unpadded(const AttentionMask2D& m, int64_t b, int64_t kv_offset, int64_t kv_length) {
  if (kv_offset < 0 || kv_offset + kv_length > m.cols) return false;
  for (int64_t j = kv_offset; j < kv_offset + kv_length; ++j)
    if (!m.at(b, j)) return false;
  return true;
}

}  // namespace

std::optional<std::vector<int32_t>> find_packed_sequence_indices(const int64_t* position_ids,
                                                                 int64_t batch, int64_t len) {
  if (!position_ids || batch < 1 || len < 1)
    bad("find_packed_sequence_indices", "position_ids must be [batch >= 1, len >= 1], got [" +
                                            std::to_string(batch) + ", " + std::to_string(len) +
                                            "]" + (position_ids ? "" : " (null)"));
  std::vector<int32_t> ids(static_cast<size_t>(batch * len));
  bool packed = false;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* p = position_ids + b * len;
    int32_t id = 0;
    ids[static_cast<size_t>(b * len)] = 0;
    for (int64_t i = 1; i < len; ++i) {
      // v5: diff(position_ids) != 1 starts a sequence (p[i-1] + 1 cannot overflow: checked).
      if (p[i - 1] == std::numeric_limits<int64_t>::max() || p[i] != p[i - 1] + 1) ++id;
      ids[static_cast<size_t>(b * len + i)] = id;
    }
    packed |= id != 0;
  }
  if (!packed) return std::nullopt;
  return ids;
}

std::optional<std::vector<uint8_t>> flash_attention_mask(const AttentionMask2D& mask,
                                                         int64_t kv_length) {
  if (kv_length < 1)
    bad("flash_attention_mask", "kv_length must be >= 1, got " + std::to_string(kv_length));
  if (!mask) return std::nullopt;
  const int64_t n = std::min(kv_length, mask.cols), first = mask.cols - n;
  std::vector<uint8_t> out(static_cast<size_t>(mask.batch * n));
  bool any_pad = false;
  for (int64_t b = 0; b < mask.batch; ++b)
    for (int64_t j = 0; j < n; ++j) {
      const bool real = mask.at(b, first + j);
      out[static_cast<size_t>(b * n + j)] = real ? 1 : 0;
      any_pad |= !real;
    }
  if (!any_pad) return std::nullopt;
  return out;
}

bool ignore_causal_mask_sdpa(const AttentionMask2D& mask, int64_t q_length, int64_t kv_length,
                             int64_t kv_offset, int64_t local_size) {
  if (!(q_length == 1 || kv_length == q_length)) return false;
  if (local_size > 0 && kv_length >= local_size) return false;
  if (mask)
    for (int64_t b = 0; b < mask.batch; ++b)
      if (!row_unpadded(mask, b, kv_offset, kv_length)) return false;
  return true;
}

const char* mask_pattern_name(MaskPattern p) {
  switch (p) {
    case MaskPattern::kFull:
      return "full";
    case MaskPattern::kSliding:
      return "sliding";
    case MaskPattern::kChunked:
      return "chunked";
  }
  return "?";
}

std::optional<MaskPattern> mask_pattern_for_layer_type(std::string_view t) {
  // transformers v5 masking_utils.py LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.
  if (t == "full_attention" || t == "deepseek_sparse_attention") return MaskPattern::kFull;
  if (t == "sliding_attention" || t == "compressed_sparse_attention" ||
      t == "heavily_compressed_attention")
    return MaskPattern::kSliding;
  if (t == "chunked_attention") return MaskPattern::kChunked;
  return std::nullopt;
}

MaskSpec PatternMask::spec() const {
  MaskSpec s;
  s.causal = true;
  s.sliding_window = sliding_window;
  s.chunk_size = chunk_size;
  s.chunk_offset = chunk_offset.empty() ? nullptr : chunk_offset.data();
  s.kv_begin = kv_begin.empty() ? nullptr : kv_begin.data();
  s.kv_end = kv_end.empty() ? nullptr : kv_end.data();
  s.doc_ids = doc_ids.empty() ? nullptr : doc_ids.data();
  s.doc_len = doc_ids.empty() ? 0 : doc_len;
  return s;
}

void PatternMask::apply(AttentionOptions* o) const {
  const MaskSpec s = spec();
  o->causal = s.causal;
  o->sliding_window = s.sliding_window;
  o->chunk_size = s.chunk_size;
  o->chunk_offset = s.chunk_offset;
  o->kv_valid_begin = s.kv_begin;
  o->kv_valid_end = s.kv_end;
  o->doc_ids = s.doc_ids;
  o->doc_len = s.doc_len;
  o->q_offset = geometry.q_offset;
  o->kv_offset = geometry.kv_offset;
}

Tensor PatternMask::materialize() const {
  return materialize_additive_mask(spec(), geometry);
}

GenerateMasks create_masks_for_generate(const GenerateMaskInputs& in) {
  const std::string who = "create_masks_for_generate";
  const int64_t L = static_cast<int64_t>(in.layer_types.size());
  if (L == 0) bad(who, "layer_types is empty (one type per layer, from the model config)");
  if (in.batch < 1 || in.q_len < 1)
    bad(who, "batch and q_len must be >= 1, got " + std::to_string(in.batch) + " and " +
                 std::to_string(in.q_len));
  const bool cached = !in.kv_extents.empty();
  if (cached && static_cast<int64_t>(in.kv_extents.size()) != L)
    bad(who, "kv_extents has " + std::to_string(in.kv_extents.size()) + " entries for " +
                 std::to_string(L) + " layers (one per layer, or none without a cache)");
  if (!cached && in.past_len != 0)
    bad(who, "past_len is " + std::to_string(in.past_len) +
                 " but no kv_extents were given (pass the cache's mask sizes per layer)");
  if (in.past_len < 0) bad(who, "past_len must be >= 0");
  const AttentionMask2D& am = in.attention_mask;
  if (am && (am.batch != in.batch || am.cols < 1))
    bad(who, "attention_mask is [" + std::to_string(am.batch) + ", " + std::to_string(am.cols) +
                 "], expected [batch = " + std::to_string(in.batch) + ", cols >= 1]");

  // Patterns first: an unmapped or unconfigured layer fails before anything is built.
  std::vector<MaskPattern> pattern(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const std::string& t = in.layer_types[static_cast<size_t>(l)];
    const std::optional<MaskPattern> p = mask_pattern_for_layer_type(t);
    if (!p)
      bad(who,
          "layer " + std::to_string(l) + " has type '" + t +
              "', which maps to no mask (mapped: full_attention, sliding_attention, " +
              "chunked_attention, compressed_sparse_attention, heavily_compressed_attention, " +
              "deepseek_sparse_attention); build that layer's mask separately");
    if (*p == MaskPattern::kSliding && in.sliding_window < 1)
      bad(who, "layer " + std::to_string(l) + " is '" + t +
                   "' but sliding_window is not set (set it from the model config)");
    if (*p == MaskPattern::kChunked && in.attention_chunk_size < 1)
      bad(who, "layer " + std::to_string(l) +
                   " is 'chunked_attention' but attention_chunk_size is not set (set it from " +
                   "the model config)");
    pattern[static_cast<size_t>(l)] = *p;
  }

  // Padding: one run of real tokens per row, [begin, end) in absolute positions (columns).
  std::vector<int64_t> begin, end;
  if (am) {
    begin.resize(static_cast<size_t>(in.batch));
    end.resize(static_cast<size_t>(in.batch));
    for (int64_t b = 0; b < in.batch; ++b) {
      int64_t lo = 0;
      while (lo < am.cols && !am.at(b, lo)) ++lo;
      int64_t hi = lo;
      while (hi < am.cols && am.at(b, hi)) ++hi;
      for (int64_t j = hi; j < am.cols; ++j)
        if (am.at(b, j))
          bad(who, "attention_mask row " + std::to_string(b) + " has padding at column " +
                       std::to_string(hi) + " between real tokens (up to column " +
                       std::to_string(j) + "): only left and right padding are supported; " +
                       "give packed sequences as position_ids without an attention mask");
      begin[static_cast<size_t>(b)] = lo;
      end[static_cast<size_t>(b)] = hi;  // an all-padding row: [cols, cols), nothing visible
    }
  }

  // Packed sequences (v5 _preprocess_mask_arguments: only without a mask and without a cache).
  std::optional<std::vector<int32_t>> docs;
  if (in.position_ids && !am && !cached) {
    if (in.position_ids_batch != 1 && in.position_ids_batch != in.batch)
      bad(who, "position_ids has batch " + std::to_string(in.position_ids_batch) +
                   ", expected 1 or " + std::to_string(in.batch));
    std::vector<int64_t> expanded;
    const int64_t* pos = in.position_ids;
    if (in.position_ids_batch != in.batch) {  // broadcast one row, as v5's expand
      expanded.resize(static_cast<size_t>(in.batch * in.q_len));
      for (int64_t b = 0; b < in.batch; ++b)
        std::copy(pos, pos + in.q_len, expanded.begin() + b * in.q_len);
      pos = expanded.data();
    }
    docs = find_packed_sequence_indices(pos, in.batch, in.q_len);
  }

  GenerateMasks out;
  out.layer_mask.resize(static_cast<size_t>(L));
  for (int64_t l = 0; l < L; ++l) {
    const MaskPattern p = pattern[static_cast<size_t>(l)];
    KvExtent e;
    if (cached) {
      e = in.kv_extents[static_cast<size_t>(l)];
      if (e.kv_len < 1 || e.kv_offset < 0)
        bad(who, "layer " + std::to_string(l) + ": kv extent {" + std::to_string(e.kv_len) + ", " +
                     std::to_string(e.kv_offset) + "} needs kv_len >= 1, kv_offset >= 0");
    } else {
      e.kv_len = am ? am.cols : in.q_len;  // v5: "rely on the mask instead" (prefix tuning)
    }
    const int64_t q_offset = cached ? in.past_len : 0;
    int found = -1;
    for (size_t m = 0; m < out.masks.size(); ++m) {
      const PatternMask& x = out.masks[m];
      if (x.pattern == p && x.geometry.kv_len == e.kv_len && x.geometry.kv_offset == e.kv_offset &&
          x.geometry.q_offset == q_offset)
        found = static_cast<int>(m);
    }
    if (found < 0) {
      PatternMask pm;
      pm.pattern = p;
      pm.geometry = make_geometry(in.batch, 1, in.q_len, e.kv_len, q_offset, e.kv_offset);
      if (p == MaskPattern::kSliding) pm.sliding_window = in.sliding_window;
      if (p == MaskPattern::kChunked) pm.chunk_size = in.attention_chunk_size;
      // Padding only where it hides something: kernels take their mask-free paths otherwise.
      bool pad_matters = false;
      for (int64_t b = 0; am && b < in.batch; ++b)
        pad_matters |= !row_unpadded(am, b, e.kv_offset, e.kv_len);
      if (pad_matters) {
        pm.kv_begin = begin;
        pm.kv_end = end;
      }
      // v5 create_chunked_causal_mask: left padding = the leading zeros of each row.
      if (p == MaskPattern::kChunked && am &&
          std::any_of(begin.begin(), begin.end(), [](int64_t x) { return x != 0; }))
        pm.chunk_offset = begin;
      if (docs) {
        pm.doc_ids = *docs;
        pm.doc_len = in.q_len;
      }
      pm.all_visible = mask_is_all_visible(pm.spec(), pm.geometry);
      out.masks.push_back(std::move(pm));
      found = static_cast<int>(out.masks.size()) - 1;
    }
    out.layer_mask[static_cast<size_t>(l)] = found;
  }
  return out;
}

}  // namespace kvcache
