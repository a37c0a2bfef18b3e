// Cache: one CacheLayer per model layer, built from the config's `layer_types` through the
// layer registry (each container registers its own names; no central switch), plus lifecycle
// operations over all layers at once. Honours num_kv_shared_layers: the last N layers own no
// storage and read the span their source layer (the last earlier layer of the same type, as in
// Gemma-3n) returned at this step.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/cache_layer.h"
#include "cache/kv_policy.h"
#include "core/dtype.h"
#include "core/kv_span.h"

namespace kvcache {

class PagedKVStore;          // cache/paged_store.h
class LinearCacheLayer;      // cache/linear_state_layer.h
class CompressedCacheLayer;  // cache/compressed_cache_layer.h
class IndexedCacheLayer;     // cache/compressed_cache_layer.h
struct ConvStateUpdate;      // cache/linear_state_layer.h

// The format of a quantized paged pool (issue 43; cache/paged_store.h "Quantized pages"): the
// packed scheme and, for KIVI, the code width. The key group is the block: block_tokens tokens.
struct PagedQuantFormat {
  KVQuantScheme scheme = KVQuantScheme::kKivi;
  int bits = 4;  // KIVI: 2, 4 or 8; q8_0: 8; q4_0: 4
  bool operator==(const PagedQuantFormat&) const = default;
};

// Options of the "paged" containers (cache/paged_layer.h).
struct PagedOptions {
  int64_t block_tokens = 16;  // tokens per block
  // The store every layer writes into (built by the runtime from a memory plan). Unset: each
  // paged layer builds a private store of block_tokens-token blocks sized for max_cache_len
  // tokens per batch row (max_batch_size rows, at least 1).
  std::shared_ptr<PagedKVStore> store = nullptr;
  // Hybrid models (linear_attention layers): the linear layers' state is snapshotted for the
  // prefix cache each time a sequence reaches a multiple of snapshot_every_blocks blocks (the
  // runtime ends prefill chunks there), and at most max_snapshots snapshots are kept (each one
  // sequence's whole state, e.g. 64 KiB on dummy:qwen3next-tiny, ~75 MiB on Qwen3-Next-80B;
  // billed by the planner). A prefix hit restores the latest snapshot at or before it. 0: none
  // (a hybrid model never hits). Read only when the model has linear layers.
  int32_t snapshot_every_blocks = 4;
  int32_t max_snapshots = 16;
  // Quantized pages: unset, the pages hold kv_dtype rows. Set: a full block's pages are one
  // packed group of block_tokens tokens in this format, the partial last block of each sequence
  // its residual in kv_dtype (quantized when it fills).
  std::optional<PagedQuantFormat> quant;
};

// Options of the "quantized" containers (cache/quantized_layer.h).
struct QuantizedOptions {
  // Packed format: KIVI (default) or llama.cpp's per-token q8_0 / q4_0 (which fix their own
  // code width).
  KVQuantScheme scheme = KVQuantScheme::kKivi;
  int bits = 4;  // KIVI code width: 2, 4 or 8
  // Tokens per key group (values: channels per group, clamped to a divisor of the head dim).
  int64_t group = 64;
  int64_t residual = 128;  // most recent tokens kept in full precision
};

// Options of the "linear_attention" containers (cache/linear_state_layer.h).
struct LinearStateOptions {
  // While past recording is on: snapshot the recurrent state at every update_recurrent_state
  // and keep the newest N snapshots (0: only explicit snapshot() calls, all kept).
  int64_t auto_snapshots = 0;
};

// Options of the "offloaded" containers (cache/offloaded_layer.h): transformers' OffloadedCache
// (Cache(offloading=True)) on a CPU. The offloaded tier is a file per layer in `dir` (unlinked
// at creation: nothing is left behind); at most two offloaded layers are resident at once.
struct OffloadOptions {
  std::string dir;               // where the layer files go; empty: $TMPDIR or /tmp
  bool only_non_sliding = true;  // transformers' default: sliding/chunked layers stay resident
  // Benchmarks of a cold page cache: before every read of a layer file, sync it and drop its
  // pages (posix_fadvise POSIX_FADV_DONTNEED), so the read comes from the device.
  bool drop_page_cache = false;
};

// Per-Cache objects that the layers of one Cache share (the offloaded containers' resident slots
// and copier, ...): the Cache creates one context and hands it to every factory through
// CacheConfig::context, so that a container family keeps its shared state without a central
// switch and two caches never share it.
class CacheContext {
 public:
  // The object stored under `key`, made by make() on first use.
  template <typename T, typename Make>
  T& get(const std::string& key, Make make) {
    auto& slot = items_[key];
    if (!slot) slot = std::shared_ptr<T>(make());
    return *static_cast<T*>(slot.get());
  }

 private:
  std::map<std::string, std::shared_ptr<void>> items_;
};

// What a user chooses of a cache; CacheConfig adds what the model dictates. Every container
// reads the common fields; a family's own struct (paged, quantized) is read by that family
// only, so its options need no prefix and no other container has to know them.
struct CacheOptions {
  // transformers' cache_implementation: "dynamic", "static", ... (whatever the registry holds).
  std::string implementation = "dynamic";
  int64_t max_cache_len = 0;   // capacity in tokens (static containers, private paged stores)
  int64_t max_batch_size = 0;  // static containers: rows preallocated (0: from first update)
  std::optional<DType> kv_dtype = std::nullopt;  // storage dtype; unset: the first update's
  // Which keys full-attention layers keep (cache/kv_policy.h). A lossy policy builds the
  // full_attention layers from PolicyLayerRegistry (the implementations that honour it); the
  // other layer types keep their own container (sliding and chunked layers are bounded already).
  KVPolicy policy = {};
  PagedOptions paged = {};
  QuantizedOptions quantized = {};
  LinearStateOptions linear_state = {};
  OffloadOptions offload = {};
};

// The state of one "linear_attention" layer (Gated DeltaNet, Qwen3-Next) per batch row: the
// causal conv's window, the last K-1 inputs [K-1, C] (kernels/causal_conv.h), and the recurrent
// state [H_v, d_k, d_v] (kernels/gated_delta.h), both f32. The planner bills the same
// H_v·d_k·d_v + (K-1)·C elements per sequence (model/kv_plan.cc). All zero: no linear layers.
struct LinearStateShape {
  int64_t conv_kernel = 0;  // K, the conv's taps (linear_conv_kernel_dim)
  int64_t conv_dim = 0;     // C = 2·H_k·d_k + H_v·d_v, the q, k, v channels the conv reads
  int64_t heads_v = 0;      // H_v (linear_num_value_heads)
  int64_t head_dim_k = 0;   // d_k (linear_key_head_dim)
  int64_t head_dim_v = 0;   // d_v (linear_value_head_dim)
};

// Read by the compressed and indexed containers (cache/compressed_cache_layer.h): the tokens
// per entry of each compressed layer type (DeepSeek-V4: compressed_sparse_attention 4,
// heavily_compressed_attention 128) and the indexer key width (CSA, deepseek_sparse_attention).
struct CompressedShape {
  std::map<std::string, int64_t> rates;
  int64_t index_head_dim = 0;
};

// A cache for one model: the user's options and the model's layer plan. The registry hands it
// unchanged to every layer factory.
struct CacheConfig {
  CacheOptions options;
  // One entry per model layer: "full_attention", "sliding_attention", "chunked_attention", ...
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;  // W: keys a query sees, itself included (sliding layers)
  // Per-layer windows, one entry per model layer (0: sliding_window), for models whose sliding
  // layers differ (transformers v5 builds one DynamicSlidingWindowLayer per layer, each with its
  // own window) and Cache::from_layer_data. Empty: sliding_window everywhere. Read it through
  // window_of(). The paged store has one window for all its layers and refuses differing ones.
  std::vector<int64_t> layer_windows;
  // The window of sliding layer `layer_index`: layer_windows' entry when set, else
  // sliding_window.
  int64_t window_of(int layer_index) const;
  int64_t attention_chunk_size = 0;  // chunk length (chunked layers)
  int num_kv_shared_layers = 0;      // the last N layers store nothing
  // What update()'s (K, V) pair is: per-head keys and values, or MLA's one-head latent c_kv
  // [B, 1, S, d_c] and rotated key k_rot [B, 1, S, d_r] (DeepSeek-V2/V3). Containers that
  // need per-head K/V refuse kMlaLatent at construction. kSharedKV: K and V are one tensor
  // (DeepSeek-V4's sliding layers: update(kv, kv) with the same view); the dense containers
  // store it once (half the bytes) and return a span whose v aliases k; containers that cannot
  // (quantized) refuse it at construction.
  enum class KVContent { kPerHead, kMlaLatent, kSharedKV };
  KVContent kv_content = KVContent::kPerHead;
  // Read by the "linear_attention" containers only (cache/linear_state_layer.h).
  LinearStateShape linear = {};
  CompressedShape compressed = {};
  // Set by the Cache before it builds its layers (one per Cache; see CacheContext).
  std::shared_ptr<CacheContext> context = nullptr;
};

// Builds one layer of the given cache implementation and layer type.
using LayerFactory =
    std::function<std::unique_ptr<CacheLayer>(const CacheConfig& config, int layer_index)>;

class LayerRegistry {
 public:
  // Registers (implementation, layer_type); a duplicate registration aborts (a bug).
  static void add(const std::string& implementation, const std::string& layer_type,
                  LayerFactory factory);
  // Throws Error naming the known implementations / layer types when there is no entry.
  static std::unique_ptr<CacheLayer> create(const std::string& implementation,
                                            const std::string& layer_type,
                                            const CacheConfig& config, int layer_index);
  static bool contains(const std::string& implementation, const std::string& layer_type);
  // "implementation/layer_type" for every entry, sorted.
  static std::vector<std::string> names();
  // A combination a container declines on purpose: create() then throws Error(kUnsupported)
  // "layer N (implementation/layer_type): <reason>" — why, and what to use instead — instead of
  // the generic "no cache container" list. Not an entry: contains() and names() ignore it.
  static void refuse(const std::string& implementation, const std::string& layer_type,
                     std::string reason);
};

// Static registration from a container's own .cc file:
//   KVCACHE_REGISTER_LAYER(dynamic_full, "dynamic", "full_attention", make_dynamic_layer);
#define KVCACHE_REGISTER_LAYER(ident, implementation, layer_type, factory) \
  static const bool kvcache_registered_##ident = [] {                      \
    ::kvcache::LayerRegistry::add(implementation, layer_type, factory);    \
    return true;                                                           \
  }()
// From the same file, for a layer type the container declines (LayerRegistry::refuse).
#define KVCACHE_REFUSE_LAYER(ident, implementation, layer_type, reason)   \
  static const bool kvcache_refused_##ident = [] {                        \
    ::kvcache::LayerRegistry::refuse(implementation, layer_type, reason); \
    return true;                                                          \
  }()

// Containers that honour a lossy KVPolicy on full_attention layers, by cache implementation
// ("dynamic", ...); each registers itself from its own file, as LayerRegistry's do. The factory
// reads config.options.policy.
class PolicyLayerRegistry {
 public:
  static void add(const std::string& implementation, LayerFactory factory);
  // Error(kUnsupported) naming the policy and the implementations that honour it.
  static std::unique_ptr<CacheLayer> create(const std::string& implementation,
                                            const CacheConfig& config, int layer_index);
  static std::vector<std::string> implementations();  // sorted
};

#define KVCACHE_REGISTER_POLICY_LAYER(ident, implementation, factory) \
  static const bool kvcache_policy_registered_##ident = [] {          \
    ::kvcache::PolicyLayerRegistry::add(implementation, factory);     \
    return true;                                                      \
  }()

// One model layer's keys and values for Cache::from_layer_data (transformers v5's DynamicCache
// built from legacy per-layer data): [B, H_kv, S, D_k] and [B, H_kv, S, D_v], any float dtype,
// and the layer's window (0: full attention; W > 0: a sliding layer of window W, which keeps
// only the last W-1 of the S tokens, as v5's DynamicSlidingWindowLayer does).
struct LayerData {
  TensorView k;
  TensorView v;
  int64_t sliding_window = 0;
};

// Either a config (layers built from its layer_types through the registry) or layers built by
// the caller — not both (transformers v5's Cache.__init__ refuses `layers` together with
// `layer_class_to_replicate`; Cache::create refuses the same). See Cache::create.
struct CacheSource {
  std::optional<CacheConfig> config;
  std::vector<std::unique_ptr<CacheLayer>> layers;
};

class Cache {
 public:
  // Builds every layer; throws Error for unknown layer types or invalid options, naming the
  // layer index and the type.
  explicit Cache(const CacheConfig& config);

  // From a config or from explicit layers; Error(kInvalidArgument) when given both or neither.
  // Explicit layers: the config's layer_types and implementation come from their registry
  // names ("dynamic/sliding_attention" -> implementation "dynamic", type "sliding_attention");
  // no layer is shared.
  static std::unique_ptr<Cache> create(CacheSource source);
  // transformers v5's DynamicCache(ddp_cache_data): one layer per entry, each filled with its
  // keys and values (a window per layer: full_attention for 0, sliding_attention of that
  // window otherwise), built by `options.implementation` (default dynamic). Error when the
  // list is empty or the layers' batches differ.
  static std::unique_ptr<Cache> from_layer_data(std::span<const LayerData> layers,
                                                CacheOptions options = {});

  // A deep copy: a new Cache of this config (its own storage and context) holding the same
  // tokens, independent of this one. Made through each layer's save()/load(), so what a session
  // file does not keep is not copied either (a linear layer's past recording and snapshots).
  // Error(kUnsupported) naming the layer for containers that cannot be saved; the paged
  // containers refuse (their blocks live in a store shared with other sequences: fork a
  // sequence with repeat_interleave instead).
  std::unique_ptr<Cache> clone() const;

  // The keys and values a layer holds now (transformers v5's `for keys, values in cache` and
  // layers[i].keys / .values): views [B, H_kv, S_held, D] valid until the next mutating call,
  // kv_offset the position of the first (a sliding layer holds its last W-1 tokens; a static
  // layer returns only its filled prefix, see static_layer.h). A shared layer: its source's.
  // Error(kUnsupported) for containers whose storage is not a dense token axis (quantized,
  // paged, offloaded, linear, ...), naming the layer.
  KVSpan stored_kv(int layer) const;

  // transformers v5's Cache.batch_size: the rows of the layers that hold some (-1 when none
  // does yet); Error(kInvalidArgument) when they differ. Dense containers only report rows; a
  // container that does not is skipped.
  int64_t batch_size() const;
  // Per layer (v5's Cache.is_sliding): true for sliding_attention and chunked_attention layers
  // (v5's chunked layers are sliding-window layers).
  std::vector<bool> is_sliding() const;
  // v5's Cache.is_compileable: every owning layer has a fixed shape and address (static
  // containers, linear states); false for a growing one.
  bool is_compileable() const;

  int num_layers() const;
  const CacheConfig& config() const { return config_; }

  // The update of an owning layer. A shared layer refuses it: see shared_kv().
  // Offloadable layers (CacheLayer::offloadable) are driven as transformers' Cache.update does
  // with offloading: before layer l's update, the previous offloadable layer (cyclically) is
  // offloaded and the next one (cyclically: the last layer prefetches the first for the next
  // step) is prefetched, so its copy overlaps layer l's compute.
  KVSpan update(int layer, const TensorView& k, const TensorView& v);
  // Model code's one call per attention layer: update() for an owning layer; for a shared
  // layer, which stores nothing, its source's latest span (shared_kv(); k and v, which the
  // model does not project for it, are not read).
  KVSpan update_or_share(int layer, const TensorView& k, const TensorView& v);
  bool is_shared(int layer) const;
  int source_layer(int layer) const;  // itself for non-shared layers
  // The span the source layer returned at its latest update (valid until its next update).
  KVSpan shared_kv(int layer) const;

  // CacheLayer::observe_queries of an owning layer that wants them (shared layers: nothing; their
  // source scores keys by its own queries).
  void observe_queries(int layer, const TensorView& q, const AttentionOptions& options);

  // For a shared layer: its source's (the kernel reads the source's span). Call before the
  // step's updates, like transformers builds masks before the forward.
  MaskSizes mask_sizes(int layer, int64_t query_len) const;
  // No layer given: layer 0, or, when layer 0 is a linear-attention layer, the first other
  // owning layer (transformers v5: the cache's lengths are its attention layers'; a static
  // cache's max_length ignores linear layers). A linear layer's own: tokens fed to its conv
  // (seq_length) and -1 (max_length: it holds a fixed-size state, no token axis).
  int64_t seq_length(std::optional<int> layer = std::nullopt) const;
  int64_t max_length(std::optional<int> layer = std::nullopt) const;

  // Linear-attention layers (transformers v5's LinearAttentionCacheLayerMixin calls).
  bool is_linear(int layer) const;
  // The layer's state container; Error naming the layer's type when it is not linear.
  LinearCacheLayer& linear_layer(int layer);
  const LinearCacheLayer& linear_layer(int layer) const;
  // See LinearStateLayer::update_conv_state / update_recurrent_state.
  ConvStateUpdate update_conv_state(int layer, const TensorView& x);
  TensorView update_recurrent_state(int layer, const TensorView& state);
  // Whether the linear layer has state from earlier tokens (its first update has been made
  // since the cache was built or reset). No layer: the last linear layer. Error for an
  // attention layer, or when the cache has no linear layer.
  bool has_previous_state(std::optional<int> layer = std::nullopt) const;
  // Every linear layer's snapshot(): crop() may come back to this position (the paged
  // container refuses: it snapshots at block boundaries for the prefix cache on its own).
  void snapshot_linear_states();

  // Compressed (CSA/HCA) and indexed (DSA) layers: the layer's face; Error naming the layer's
  // type when it is not one.
  CompressedCacheLayer& compressed_layer(int layer);
  IndexedCacheLayer& indexed_layer(int layer);

  // Lifecycle over every owning layer; each also forgets the spans shared_kv() would return
  // (they may point at moved data). A failing layer throws; earlier layers have then been
  // changed already: validate arguments (e.g. crop lengths) against one layer first if that
  // matters. crop() checks every linear and compressed layer can go back (check_crop)
  // before it changes any layer.
  void crop(int64_t n);
  void reset();
  // Every layer's CacheLayer::reserve(tokens): room for `tokens` tokens per batch row without
  // reallocating (growing containers only). Spans returned earlier are invalidated.
  void reserve(int64_t tokens);
  void reorder(std::span<const int64_t> beam_idx);
  void repeat_interleave(int64_t r);
  void select(std::span<const int64_t> indices);
  void activate_past_recording();  // see CacheLayer::activate_past_recording
  void offload(int layer);
  void prefetch(int layer);

  size_t bytes() const;            // sum over the layers that own storage (resident bytes)
  size_t offloaded_bytes() const;  // sum of the layers' offloaded_bytes()

  // Every owning layer's save()/load(), each framed by its index and registry name (load
  // checks both, Error(kFormat) naming the first that differs). load() expects a cache of the
  // same config, fresh or reset.
  void save(StateWriter& out) const;
  void load(StateReader& in);
  // The layer object; Error for a shared layer (it owns none: see source_layer()).
  CacheLayer& layer(int layer);
  const CacheLayer& layer(int layer) const;

 private:
  struct FromLayers {};
  Cache(FromLayers, std::vector<std::unique_ptr<CacheLayer>> layers);
  void invalidate_spans();

  CacheConfig config_;
  std::vector<std::unique_ptr<CacheLayer>> layers_;  // nullptr for shared layers
  std::vector<int> source_;                          // source_[i] == i unless shared
  std::vector<KVSpan> last_span_;                    // latest span per owning layer
  std::vector<int> offloadable_;  // owning layers whose offload/prefetch hooks update() drives
  bool explicit_layers_ = false;  // built by create() from the caller's layers, not the config
};

}  // namespace kvcache
