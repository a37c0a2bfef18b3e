#include "cache/window_layer.h"

#include <algorithm>
#include <memory>
#include <string>

#include "core/error.h"

namespace kvcache {

WindowLayer::WindowLayer(DenseLayerParams params, const WindowLayerParams& window)
    : DenseLayer(std::move(params)), window_(window) {
  if (window_.window < 1) {
    const bool sliding = window_.kind == WindowKind::kSliding;
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": " + (sliding ? "sliding_window" : "attention_chunk_size") +
                    " must be >= 1 for a " + (sliding ? "sliding_attention" : "chunked_attention") +
                    " layer, got " + std::to_string(window_.window) +
                    " (set it from the model config)");
  }
  if (window_.max_cache_len < 0) {
    throw Error(ErrorKind::kInvalidArgument, where() + ": max_cache_len must be >= 0");
  }
  keep_ = window_.window - 1;
}

int64_t WindowLayer::window_start(int64_t pos) const {
  // Chunked layers too: a left-padded row counts its chunks from its first real token
  // (AttentionOptions::chunk_offset), so the chunk of a query at pos may start anywhere in
  // (pos - C, pos] and the layer, which knows nothing of padding, keeps the last C-1 keys as
  // transformers v5 does (cache_utils.py: chunked_attention layers are
  // DynamicSlidingWindowLayer(attention_chunk_size)); the kernel's chunk mask hides the rest.
  return std::max<int64_t>(pos - window_.window + 1, 0);
}

int64_t WindowLayer::capacity_limit() const {
  // A rollback bound r holds r more tokens between steps: 2W + r keeps the O(1) moves per token.
  const int64_t two_w = 2 * window_.window + rollback_;
  if (params_.fixed_storage && window_.max_cache_len > 0)
    return std::min(two_w, window_.max_cache_len);
  return two_w;
}

int64_t WindowLayer::hold_from(int64_t length) const {
  return std::max(window_start(std::max<int64_t>(length - rollback_, 0)), first_stored_position());
}

void WindowLayer::reserve_rollback(int64_t tokens) {
  if (tokens < 0)
    throw Error(ErrorKind::kInvalidArgument,
                where() + ": reserve_rollback(" + std::to_string(tokens) + "): give 0 or more");
  // Between steps the layer then holds up to keep + tokens; a static storage is sized once, at
  // the first update, to min(2W + tokens, max_cache_len) slots.
  if (params_.fixed_storage) {
    const bool allocated = buf_.allocated();
    const int64_t capacity =
        allocated ? buf_.capacity()
                  : (window_.max_cache_len > 0
                         ? std::min(2 * window_.window + tokens, window_.max_cache_len)
                         : 2 * window_.window + tokens);
    if (capacity < keep_ + tokens)
      throw Error(ErrorKind::kOutOfRange,
                  where() + ": cannot keep " + std::to_string(tokens) +
                      " tokens for rollback beside the window's " + std::to_string(keep_) +
                      ": the static storage has " + std::to_string(capacity) + " slots (" +
                      (allocated ? "sized at the first update; reserve the rollback before the "
                                   "first update, "
                                 : "min(2*window + rollback, max_cache_len); ") +
                      "raise --max-cache-len to at least " + std::to_string(keep_ + tokens) +
                      " or use the dynamic cache)");
  }
  rollback_ = tokens;
}

int64_t WindowLayer::max_length() const {
  if (!params_.fixed_storage) return -1;
  return window_.max_cache_len > 0 ? std::min(window_.window, window_.max_cache_len)
                                   : window_.window;
}

MaskSizes WindowLayer::mask_sizes(int64_t query_len) const {
  const int64_t start = window_start(seq_length_);
  return {seq_length_ + query_len - start, start};
}

KVSpan WindowLayer::update(const TensorView& k, const TensorView& v) {
  const int64_t n = check_update(k, v);
  const int64_t start = window_start(seq_length_);
  const int64_t first = first_stored_position();
  KV_CHECK(first <= start, "a window layer lost keys its next queries need");
  const bool fixed = params_.fixed_storage;
  const int64_t capacity = buf_.allocated() ? buf_.capacity() : capacity_limit();

  // Everything that can fail is checked before the first mutation.
  // held: tokens the storage must hold once this update is done.
  const int64_t visible = seq_length_ - start + n;  // the span this step returns
  // Without recording: exactly what the next step's queries may see (<= keep_).
  // With a rollback bound: also the keys of the last rollback_ positions' queries.
  const int64_t held = recording_ ? buf_.size() + n : seq_length_ + n - hold_from(seq_length_ + n);
  if (fixed && held > capacity) {
    throw Error(ErrorKind::kOutOfRange,
                where() + ": cannot write " + std::to_string(n) + " tokens at position " +
                    std::to_string(seq_length_) + ": the layer must then hold " +
                    std::to_string(held) + " tokens" +
                    (recording_ ? " (past recording is on)" : "") + " but its static storage has " +
                    std::to_string(capacity) + " slots (min(2*window, max_cache_len)); raise " +
                    "--max-cache-len or use the dynamic cache");
  }
  const int64_t initial =
      fixed ? capacity
            : (recording_ ? std::max(visible, kMinCapacity)
                          : std::min(std::max(visible, kMinCapacity), capacity_limit()));
  prepare_rows(k, v, initial);

  // Tokens before `start` are seen by no query any more (unless recorded or within the
  // rollback bound, which may reach before `start` when the step is short): drop them.
  if (!recording_)
    buf_.set_window(buf_.begin() + (std::min(start, hold_from(seq_length_ + n)) - first),
                    buf_.end());
  const int64_t needed = buf_.size() + n;  // recording: everything held plus the new tokens

  KVSpan span;
  span.kv_offset = start;
  if (buf_.end() + n > buf_.capacity()) {
    // Out of room at the end. A dynamic layer below its limit grows (which also moves the
    // live tokens to slot 0); at the limit, or static, the live tokens move to slot 0 if that
    // makes room. Growing first matters: a capacity just above `keep` would otherwise
    // compact (move W-1 tokens) at every decode step.
    const bool can_grow = !fixed && (recording_ || buf_.capacity() < capacity_limit());
    if (can_grow) {
      const int64_t grown = std::max(2 * buf_.capacity(), needed);
      buf_.reallocate(buf_.batch_capacity(),
                      recording_ ? grown : std::min(grown, capacity_limit()));
    } else if (needed <= buf_.capacity()) {
      buf_.compact();
    }
  }

  if (buf_.end() + n <= buf_.capacity()) {
    buf_.append(k, v);
    const int64_t from = buf_.end() - visible;  // slot of position `start`
    span.k = buf_.k_slots(from, buf_.end());
    span.v = buf_.v_slots(from, buf_.end());
    seq_length_ += n;
  } else {
    // The step does not fit the storage (not recording: recording either fits, grows, or
    // was refused above). Assemble kept + new in the workspace, then store the last `held`.
    KV_CHECK(!recording_, "a recording window layer must fit its storage");
    TensorView wk, wv;
    workspace(needed, &wk, &wv);
    const int64_t kept = buf_.size();
    // The workspace starts at the first held position, which a rollback bound may put before
    // `start`: the span begins `lead` tokens in.
    const int64_t lead = start - (seq_length_ - kept);
    CopyStats& st = buf_.mutable_stats();
    const bool shared = shared_kv();  // wv is wk: V is not written
    st.bytes_copied += copy_view(buf_.k_slots(buf_.begin(), buf_.end()), wk.slice(2, 0, kept));
    if (!shared)
      st.bytes_copied += copy_view(buf_.v_slots(buf_.begin(), buf_.end()), wv.slice(2, 0, kept));
    copy_view(k, wk.slice(2, kept, needed));
    if (!shared) copy_view(v, wv.slice(2, kept, needed));
    st.workspace_uses += 1;
    buf_.set_window(0, 0);
    if (held > buf_.capacity()) {  // dynamic only (static checked above); nothing live to copy
      buf_.reallocate(buf_.batch_capacity(),
                      std::min(std::max(2 * buf_.capacity(), held), capacity_limit()));
    }
    st.bytes_copied += copy_view(wk.slice(2, needed - held, needed), buf_.k_slots(0, held));
    if (!shared)
      st.bytes_copied += copy_view(wv.slice(2, needed - held, needed), buf_.v_slots(0, held));
    buf_.set_window(0, held);
    span.k = wk.slice(2, lead, needed);
    span.v = wv.slice(2, lead, needed);
    seq_length_ += n;
    return span;
  }
  // Keep only what a later step may see; the returned span stays valid (no data moved).
  if (!recording_) buf_.set_window(buf_.end() - held, buf_.end());
  return span;
}

void WindowLayer::crop(int64_t n) {
  const int64_t length = crop_length(n, seq_length_);
  if (length == 0) {  // always reachable, whatever the window dropped
    reset();
    return;
  }
  if (length != seq_length_) cut_to(length);
  // transformers v5's Cache.crop: a layer that needs not keep its past goes back to its working
  // size — the keys the next queries may see — even on crop(0). Past recording stays on.
  if (buf_.allocated()) {
    const int64_t working = seq_length_ - hold_from(seq_length_);
    buf_.set_window(buf_.end() - working, buf_.end());
  }
}

bool WindowLayer::stored(KVSpan* out) const {
  if (!buf_.allocated()) return false;
  out->k = buf_.k_slots(buf_.begin(), buf_.end());
  out->v = buf_.v_slots(buf_.begin(), buf_.end());
  out->kv_offset = first_stored_position();
  return true;
}

void WindowLayer::cut_to(int64_t length) {
  const int64_t first = first_stored_position();
  const int64_t needed_from = window_start(length);
  if (needed_from < first) {
    throw Error(ErrorKind::kOutOfRange,
                where() + ": cannot crop to " + std::to_string(length) + " tokens: a query at " +
                    "position " + std::to_string(length) + " needs keys from position " +
                    std::to_string(needed_from) + " but the window holds only positions [" +
                    std::to_string(first) + ", " + std::to_string(seq_length_) +
                    "); call activate_past_recording() before generating tokens you may " +
                    "drop (e.g. speculative drafts)");
  }
  buf_.set_window(buf_.begin(), buf_.begin() + (length - first));
  seq_length_ = length;
}

int64_t WindowLayer::restore_capacity(const SavedPosition& p) const {
  // The next queries need keys from window_start(seq_length): the kept tokens must cover them.
  const int64_t needed = p.seq_length - window_start(p.seq_length);
  if (p.stored < needed)
    refuse_restore("the file keeps " + std::to_string(p.stored) + " tokens but a query at " +
                   "position " + std::to_string(p.seq_length) + " needs " + std::to_string(needed) +
                   " (was it saved with another window?)");
  if (!p.recording && p.stored > keep_)
    refuse_restore("the file keeps " + std::to_string(p.stored) + " tokens, more than the " +
                   std::to_string(keep_) + " this window keeps (another window size?)");
  const int64_t capacity = buf_.allocated() ? buf_.capacity() : capacity_limit();
  if (params_.fixed_storage) {
    if (p.stored > capacity)
      refuse_restore("the file keeps " + std::to_string(p.stored) +
                     " tokens (past recording) but this static layer has " +
                     std::to_string(capacity) + " slots; raise --max-cache-len");
    return capacity;
  }
  return p.recording ? std::max(p.stored, kMinCapacity)
                     : std::min(std::max(p.stored, kMinCapacity), capacity_limit());
}

void WindowLayer::restore_position(const SavedPosition& p) {
  seq_length_ = p.seq_length;
  recording_ = recording_ || p.recording;
}

void WindowLayer::reset() {
  if (buf_.allocated()) buf_.set_window(0, 0);
  seq_length_ = 0;
}

namespace {
template <WindowKind kKind, bool kFixed>
std::unique_ptr<CacheLayer> make_window(const CacheConfig& config, int layer_index) {
  const bool sliding = kKind == WindowKind::kSliding;
  std::string name = std::string(kFixed ? "static/" : "dynamic/") +
                     (sliding ? "sliding_attention" : "chunked_attention");
  WindowLayerParams w;
  w.kind = kKind;
  w.window = sliding ? config.window_of(layer_index) : config.attention_chunk_size;
  w.max_cache_len = kFixed ? config.options.max_cache_len : 0;
  return std::make_unique<WindowLayer>(dense_params(config, layer_index, std::move(name), kFixed),
                                       w);
}
}  // namespace

KVCACHE_REGISTER_LAYER(dynamic_sliding, "dynamic", "sliding_attention",
                       (make_window<WindowKind::kSliding, false>));
KVCACHE_REGISTER_LAYER(static_sliding, "static", "sliding_attention",
                       (make_window<WindowKind::kSliding, true>));
KVCACHE_REGISTER_LAYER(dynamic_chunked, "dynamic", "chunked_attention",
                       (make_window<WindowKind::kChunked, false>));
KVCACHE_REGISTER_LAYER(static_chunked, "static", "chunked_attention",
                       (make_window<WindowKind::kChunked, true>));

}  // namespace kvcache
