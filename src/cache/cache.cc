#include "cache/cache.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <utility>

#include "cache/compressed_cache_layer.h"
#include "cache/layer_state.h"
#include "cache/linear_state_layer.h"
#include "core/error.h"

namespace kvcache {

namespace {
using RegistryMap = std::map<std::pair<std::string, std::string>, LayerFactory>;
// Function-local so that registration from any translation unit's static initialiser finds
// it constructed (no static initialisation order problem).
RegistryMap& registry() {
  static RegistryMap map;
  return map;
}
std::map<std::pair<std::string, std::string>, std::string>& refusals() {
  static std::map<std::pair<std::string, std::string>, std::string> map;
  return map;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

void LayerRegistry::add(const std::string& implementation, const std::string& layer_type,
                        LayerFactory factory) {
  const bool inserted =
      registry().emplace(std::pair{implementation, layer_type}, std::move(factory)).second;
  KV_CHECK(inserted, "cache layer registered twice: " + implementation + "/" + layer_type);
  KV_CHECK(!refusals().count({implementation, layer_type}),
           "a refused cache layer cannot also be registered: " + implementation + "/" + layer_type);
}

bool LayerRegistry::contains(const std::string& implementation, const std::string& layer_type) {
  return registry().count({implementation, layer_type}) > 0;
}

void LayerRegistry::refuse(const std::string& implementation, const std::string& layer_type,
                           std::string reason) {
  KV_CHECK(!registry().count({implementation, layer_type}),
           "a registered cache layer cannot also be refused: " + implementation + "/" + layer_type);
  const bool inserted =
      refusals().emplace(std::pair{implementation, layer_type}, std::move(reason)).second;
  KV_CHECK(inserted, "cache layer refused twice: " + implementation + "/" + layer_type);
}

std::vector<std::string> LayerRegistry::names() {
  std::vector<std::string> out;
  for (const auto& [key, _] : registry()) out.push_back(key.first + "/" + key.second);
  return out;  // std::map iterates in sorted order
}

std::unique_ptr<CacheLayer> LayerRegistry::create(const std::string& implementation,
                                                  const std::string& layer_type,
                                                  const CacheConfig& config, int layer_index) {
  const auto it = registry().find({implementation, layer_type});
  if (it == registry().end()) {
    if (const auto r = refusals().find({implementation, layer_type}); r != refusals().end()) {
      throw Error(ErrorKind::kUnsupported, "layer " + std::to_string(layer_index) + " (" +
                                               implementation + "/" + layer_type +
                                               "): " + r->second);
    }
    throw Error(ErrorKind::kUnsupported, "layer " + std::to_string(layer_index) +
                                             ": no cache container for layer type '" + layer_type +
                                             "' with cache implementation '" + implementation +
                                             "'; registered: " + join(names()));
  }
  return it->second(config, layer_index);
}

namespace {
std::map<std::string, LayerFactory>& policy_registry() {
  static std::map<std::string, LayerFactory> map;
  return map;
}
}  // namespace

void PolicyLayerRegistry::add(const std::string& implementation, LayerFactory factory) {
  const bool inserted = policy_registry().emplace(implementation, std::move(factory)).second;
  KV_CHECK(inserted, "policy cache layer registered twice: " + implementation);
}

std::vector<std::string> PolicyLayerRegistry::implementations() {
  std::vector<std::string> out;
  for (const auto& [name, _] : policy_registry()) out.push_back(name);
  return out;
}

std::unique_ptr<CacheLayer> PolicyLayerRegistry::create(const std::string& implementation,
                                                        const CacheConfig& config,
                                                        int layer_index) {
  const auto it = policy_registry().find(implementation);
  if (it == policy_registry().end()) {
    throw Error(ErrorKind::kUnsupported,
                "layer " + std::to_string(layer_index) + ": --kv-policy " +
                    config.options.policy.key() + " cannot act on the '" + implementation +
                    "' cache; the caches that honour a lossy policy: " + join(implementations()) +
                    " (or use --kv-policy exact)");
  }
  return it->second(config, layer_index);
}

int64_t CacheConfig::window_of(int layer_index) const {
  if (layer_windows.empty()) return sliding_window;
  if (layer_windows.size() != layer_types.size()) {
    throw Error(ErrorKind::kInvalidArgument,
                "layer_windows has " + std::to_string(layer_windows.size()) +
                    " entries for a model of " + std::to_string(layer_types.size()) +
                    " layers; give one window per layer (0: sliding_window), or none");
  }
  const int64_t w = layer_windows.at(static_cast<size_t>(layer_index));
  return w > 0 ? w : sliding_window;
}

Cache::Cache(const CacheConfig& config_in) : config_(config_in) {
  config_.context = std::make_shared<CacheContext>();
  const CacheConfig& config = config_;  // every factory sees this cache's context
  const auto n = static_cast<int>(config.layer_types.size());
  if (n == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "the cache config lists no layer_types (one entry per model layer expected)");
  }
  const int shared = config.num_kv_shared_layers;
  if (shared < 0 || shared >= n) {
    throw Error(ErrorKind::kInvalidArgument,
                "num_kv_shared_layers is " + std::to_string(shared) + " for a model of " +
                    std::to_string(n) + " layers; it must be in [0, " + std::to_string(n) + ")");
  }
  const int first_shared = n - shared;
  if (!config.layer_windows.empty()) (void)config.window_of(0);  // one entry per layer
  const bool lossy = !config.options.policy.exact();
  if (lossy && std::find(config.layer_types.begin(), config.layer_types.end(), "full_attention") ==
                   config.layer_types.end()) {
    const std::set<std::string> types(config.layer_types.begin(), config.layer_types.end());
    throw Error(ErrorKind::kUnsupported,
                "--kv-policy " + config.options.policy.key() +
                    " acts on full_attention layers and this model has none (its layer types: " +
                    join(std::vector<std::string>(types.begin(), types.end())) +
                    "); use --kv-policy exact");
  }
  layers_.resize(static_cast<size_t>(n));
  source_.resize(static_cast<size_t>(n));
  last_span_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::string& type = config.layer_types[static_cast<size_t>(i)];
    if (i < first_shared) {
      layers_[static_cast<size_t>(i)] =
          lossy && type == "full_attention"
              ? PolicyLayerRegistry::create(config.options.implementation, config, i)
              : LayerRegistry::create(config.options.implementation, type, config, i);
      source_[static_cast<size_t>(i)] = i;
      continue;
    }
    if (type == "linear_attention") {
      throw Error(ErrorKind::kUnsupported,
                  "layer " + std::to_string(i) +
                      " is KV-shared (num_kv_shared_layers = " + std::to_string(shared) +
                      ") but a linear_attention layer has its own state and cannot read another "
                      "layer's; only attention layers can be shared");
    }
    // Gemma-3n: a shared layer reads the last non-shared layer of the same attention type.
    int src = -1;
    for (int j = first_shared - 1; j >= 0; --j) {
      if (config.layer_types[static_cast<size_t>(j)] == type) {
        src = j;
        break;
      }
    }
    if (src < 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "layer " + std::to_string(i) +
                      " is KV-shared (num_kv_shared_layers = " + std::to_string(shared) +
                      ") but no earlier non-shared layer has its type '" + type + "' to read from");
    }
    source_[static_cast<size_t>(i)] = src;
  }
  for (int i = 0; i < n; ++i) {
    const auto& l = layers_[static_cast<size_t>(i)];
    if (l && l->offloadable()) offloadable_.push_back(i);
  }
}

int Cache::num_layers() const {
  return static_cast<int>(layers_.size());
}

namespace {
void check_layer_index(int layer, int n) {
  if (layer < 0 || layer >= n) {
    throw Error(ErrorKind::kInvalidArgument,
                "layer index " + std::to_string(layer) + " outside [0, " + std::to_string(n) + ")");
  }
}
}  // namespace

bool Cache::is_shared(int layer) const {
  check_layer_index(layer, num_layers());
  return source_[static_cast<size_t>(layer)] != layer;
}

int Cache::source_layer(int layer) const {
  check_layer_index(layer, num_layers());
  return source_[static_cast<size_t>(layer)];
}

CacheLayer& Cache::layer(int layer) {
  return const_cast<CacheLayer&>(static_cast<const Cache&>(*this).layer(layer));
}

const CacheLayer& Cache::layer(int layer) const {
  if (is_shared(layer)) {
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer) +
                    " is KV-shared and owns no cache; it reads layer " +
                    std::to_string(source_layer(layer)) + " (use source_layer())");
  }
  return *layers_[static_cast<size_t>(layer)];
}

KVSpan Cache::update(int layer, const TensorView& k, const TensorView& v) {
  if (is_shared(layer)) {
    throw Error(ErrorKind::kInvalidArgument, "layer " + std::to_string(layer) +
                                                 " is KV-shared: it stores nothing; call "
                                                 "shared_kv(" +
                                                 std::to_string(layer) + ") to read layer " +
                                                 std::to_string(source_layer(layer)) +
                                                 "'s keys and values");
  }
  CacheLayer& l = *layers_[static_cast<size_t>(layer)];
  if (offloadable_.size() > 1 && l.offloadable()) {  // no virtual call without offloading
    // transformers' Cache.update with offloading: the previous offloaded layer gives its slot up
    // and the next one (the first, after the last) starts reading into it while this one
    // computes. Its own prefetch was queued by the update before.
    const auto n = offloadable_.size();
    const auto i = static_cast<size_t>(std::find(offloadable_.begin(), offloadable_.end(), layer) -
                                       offloadable_.begin());
    const int prev = offloadable_[(i + n - 1) % n], next = offloadable_[(i + 1) % n];
    layers_[static_cast<size_t>(prev)]->offload();
    last_span_[static_cast<size_t>(prev)] = KVSpan{};
    layers_[static_cast<size_t>(next)]->prefetch();
  }
  KVSpan span = l.update(k, v);
  last_span_[static_cast<size_t>(layer)] = span;
  return span;
}

KVSpan Cache::update_or_share(int layer, const TensorView& k, const TensorView& v) {
  return is_shared(layer) ? shared_kv(layer) : update(layer, k, v);
}

KVSpan Cache::shared_kv(int layer) const {
  const int src = source_layer(layer);
  const KVSpan& span = last_span_[static_cast<size_t>(src)];
  // Default-constructed (no update since build or last change): a dense kind without views.
  if (span.kind == KVSpanKind::kDense && span.k.ndim() == 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer) + " reads layer " + std::to_string(src) +
                    ", which has not been updated since the cache was built or last changed "
                    "(crop/reset/reorder/...); run layer " +
                    std::to_string(src) + " first");
  }
  return span;
}

void Cache::observe_queries(int layer, const TensorView& q, const AttentionOptions& options) {
  if (is_shared(layer)) return;
  CacheLayer& l = *layers_[static_cast<size_t>(layer)];
  if (l.wants_queries()) l.observe_queries(q, options);
}

MaskSizes Cache::mask_sizes(int layer, int64_t query_len) const {
  return layers_[static_cast<size_t>(source_layer(layer))]->mask_sizes(query_len);
}

namespace {
// The layer the cache-wide lengths come from: layer 0, or the first owning non-linear layer
// when layer 0 is linear (layer 0 itself when there is none).
int length_layer(const Cache& cache) {
  if (!cache.is_linear(0)) return 0;
  for (int i = 1; i < cache.num_layers(); ++i)
    if (!cache.is_shared(i) && !cache.is_linear(i)) return i;
  return 0;
}
}  // namespace

int64_t Cache::seq_length(std::optional<int> layer) const {
  const int l = layer ? *layer : length_layer(*this);
  return layers_[static_cast<size_t>(source_layer(l))]->seq_length();
}

int64_t Cache::max_length(std::optional<int> layer) const {
  const int l = layer ? *layer : length_layer(*this);
  return layers_[static_cast<size_t>(source_layer(l))]->max_length();
}

bool Cache::is_linear(int layer) const {
  const CacheLayer* l = layers_[static_cast<size_t>(source_layer(layer))].get();
  return dynamic_cast<const LinearCacheLayer*>(l) != nullptr;
}

const LinearCacheLayer& Cache::linear_layer(int layer) const {
  const auto* l = dynamic_cast<const LinearCacheLayer*>(&this->layer(layer));
  if (l == nullptr) {
    std::string linear;
    for (int i = 0; i < num_layers(); ++i)
      if (!is_shared(i) && is_linear(i)) linear += (linear.empty() ? "" : ", ") + std::to_string(i);
    throw Error(ErrorKind::kInvalidArgument,
                "layer " + std::to_string(layer) + " is a '" +
                    config_.layer_types[static_cast<size_t>(layer)] + "' layer (" +
                    std::string(this->layer(layer).name()) +
                    "), not a linear_attention layer: linear-state calls (update_conv_state, "
                    "update_recurrent_state, has_previous_state) need one of the layers " +
                    (linear.empty() ? std::string("(none in this cache)") : linear));
  }
  return *l;
}

LinearCacheLayer& Cache::linear_layer(int layer) {
  return const_cast<LinearCacheLayer&>(static_cast<const Cache&>(*this).linear_layer(layer));
}

ConvStateUpdate Cache::update_conv_state(int layer, const TensorView& x) {
  return linear_layer(layer).update_conv_state(x);
}

TensorView Cache::update_recurrent_state(int layer, const TensorView& state) {
  return linear_layer(layer).update_recurrent_state(state);
}

bool Cache::has_previous_state(std::optional<int> layer) const {
  if (!layer) {
    for (int i = num_layers() - 1; i >= 0; --i) {
      if (!is_shared(i) && is_linear(i)) {
        layer = i;
        break;
      }
    }
    if (!layer) {
      throw Error(ErrorKind::kInvalidArgument,
                  "has_previous_state() asks the last linear_attention layer, and this cache has "
                  "none (layer_types lists attention layers only)");
    }
  }
  return linear_layer(*layer).has_previous_state();
}

namespace {
// The layer as face T, or Error naming its type and the layers that are one.
template <typename T>
T& layer_as(Cache& cache, int layer, const char* what, const char* calls) {
  auto* l = dynamic_cast<T*>(&cache.layer(layer));
  if (l != nullptr) return *l;
  std::string ok;
  for (int i = 0; i < cache.num_layers(); ++i)
    if (!cache.is_shared(i) && dynamic_cast<T*>(&cache.layer(i)) != nullptr)
      ok += (ok.empty() ? "" : ", ") + std::to_string(i);
  throw Error(ErrorKind::kInvalidArgument,
              "layer " + std::to_string(layer) + " is a '" +
                  cache.config().layer_types[static_cast<size_t>(layer)] + "' layer (" +
                  std::string(cache.layer(layer).name()) + "), not " + what + ": " + calls +
                  " need one of the layers " +
                  (ok.empty() ? std::string("(none in this cache)") : ok));
}
}  // namespace

CompressedCacheLayer& Cache::compressed_layer(int layer) {
  return layer_as<CompressedCacheLayer>(
      *this, layer,
      "a compressed layer (compressed_sparse_attention, heavily_compressed_attention)",
      "compressor calls (store_compression_weights, update_compressor_states, compressed)");
}

IndexedCacheLayer& Cache::indexed_layer(int layer) {
  return layer_as<IndexedCacheLayer>(*this, layer, "an indexed layer (deepseek_sparse_attention)",
                                     "update_indexer calls");
}

void Cache::snapshot_linear_states() {
  for (auto& l : layers_)
    if (auto* lin = dynamic_cast<LinearCacheLayer*>(l.get())) lin->snapshot();
}

void Cache::invalidate_spans() {
  std::fill(last_span_.begin(), last_span_.end(), KVSpan{});
}

void Cache::crop(int64_t n) {
  // A linear layer may refuse (no recording, no snapshot there): before any layer changes.
  for (auto& l : layers_)
    if (auto* lin = dynamic_cast<LinearCacheLayer*>(l.get())) lin->check_crop(n);
  for (auto& l : layers_)
    if (auto* c = dynamic_cast<CompressedCacheLayer*>(l.get())) c->check_crop(n);
  invalidate_spans();
  for (auto& l : layers_)
    if (l) l->crop(n);
}

void Cache::reset() {
  invalidate_spans();
  for (auto& l : layers_)
    if (l) l->reset();
}

void Cache::reserve(int64_t tokens) {
  invalidate_spans();
  for (auto& l : layers_)
    if (l) l->reserve(tokens);
}

void Cache::reorder(std::span<const int64_t> beam_idx) {
  invalidate_spans();
  for (auto& l : layers_)
    if (l) l->reorder(beam_idx);
}

void Cache::repeat_interleave(int64_t r) {
  invalidate_spans();
  for (auto& l : layers_)
    if (l) l->repeat_interleave(r);
}

void Cache::select(std::span<const int64_t> indices) {
  invalidate_spans();
  for (auto& l : layers_)
    if (l) l->select(indices);
}

void Cache::activate_past_recording() {
  for (auto& l : layers_)
    if (l) l->activate_past_recording();
}

void Cache::offload(int layer) {
  this->layer(source_layer(layer)).offload();
}
void Cache::prefetch(int layer) {
  this->layer(source_layer(layer)).prefetch();
}

size_t Cache::offloaded_bytes() const {
  size_t total = 0;
  for (const auto& l : layers_)
    if (l) total += l->offloaded_bytes();
  return total;
}

void CacheLayer::save(StateWriter&) const {
  throw Error(ErrorKind::kUnsupported,
              "the '" + std::string(name()) + "' container cannot be saved to a session file");
}

void CacheLayer::load(StateReader&) {
  throw Error(ErrorKind::kUnsupported,
              "the '" + std::string(name()) + "' container cannot be restored from a session file");
}

void Cache::save(StateWriter& out) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    out.i64(static_cast<int64_t>(i));
    out.str(layers_[i]->name());
    layers_[i]->save(out);
  }
}

void Cache::load(StateReader& in) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    const int64_t index = in.i64();
    const std::string name = in.str(256);
    if (index != static_cast<int64_t>(i) || name != layers_[i]->name()) {
      throw Error(ErrorKind::kFormat, "saved cache has layer " + std::to_string(index) + " (" +
                                          name + ") where this cache has layer " +
                                          std::to_string(i) + " (" +
                                          std::string(layers_[i]->name()) + ")");
    }
    layers_[i]->load(in);
  }
  invalidate_spans();
}

size_t Cache::bytes() const {
  size_t total = 0;
  for (const auto& l : layers_)
    if (l) total += l->bytes();
  return total;
}

namespace {
// The registry name's parts: "dynamic/full_attention+streaming:..." -> {"dynamic",
// "full_attention"}.
std::pair<std::string, std::string> split_name(std::string_view name) {
  const auto slash = name.find('/');
  if (slash == std::string_view::npos) return {std::string(name), std::string(name)};
  const auto plus = name.find('+', slash);
  return {std::string(name.substr(0, slash)),
          std::string(name.substr(slash + 1, plus == std::string_view::npos ? std::string_view::npos
                                                                            : plus - slash - 1))};
}

class MemoryWriter final : public StateWriter {
 public:
  void write(const void* data, size_t n) override {
    const auto* p = static_cast<const unsigned char*>(data);
    bytes_.insert(bytes_.end(), p, p + n);
  }
  const std::vector<unsigned char>& bytes() const { return bytes_; }

 private:
  std::vector<unsigned char> bytes_;
};

class MemoryReader final : public StateReader {
 public:
  explicit MemoryReader(const std::vector<unsigned char>& bytes) : bytes_(bytes) {}
  void read(void* data, size_t n) override {
    KV_CHECK(pos_ + n <= bytes_.size(), "clone: a layer read more than it wrote");
    std::memcpy(data, bytes_.data() + pos_, n);
    pos_ += n;
  }

 private:
  const std::vector<unsigned char>& bytes_;
  size_t pos_ = 0;
};
}  // namespace

std::unique_ptr<Cache> Cache::create(CacheSource source) {
  if (source.config && !source.layers.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "a cache is built either from a config (its layer_types, through the registry) "
                "or from explicit layers, not both: drop the config, or the layers (as "
                "transformers v5's Cache refuses `layers` with `layer_class_to_replicate`)");
  }
  if (source.config) return std::make_unique<Cache>(*source.config);
  if (source.layers.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "a cache needs a config or at least one explicit layer; got neither");
  }
  return std::unique_ptr<Cache>(new Cache(FromLayers{}, std::move(source.layers)));
}

Cache::Cache(FromLayers, std::vector<std::unique_ptr<CacheLayer>> layers) {
  config_.context = std::make_shared<CacheContext>();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i]) {
      throw Error(ErrorKind::kInvalidArgument, "explicit layer " + std::to_string(i) +
                                                   " is null; give one layer per model layer");
    }
    const auto [implementation, type] = split_name(layers[i]->name());
    if (i == 0) config_.options.implementation = implementation;
    config_.layer_types.push_back(type);
  }
  layers_ = std::move(layers);
  explicit_layers_ = true;
  const size_t n = layers_.size();
  source_.resize(n);
  for (size_t i = 0; i < n; ++i) source_[i] = static_cast<int>(i);
  last_span_.resize(n);
  for (size_t i = 0; i < n; ++i)
    if (layers_[i]->offloadable()) offloadable_.push_back(static_cast<int>(i));
}

std::unique_ptr<Cache> Cache::from_layer_data(std::span<const LayerData> layers,
                                              CacheOptions options) {
  if (layers.empty()) {
    throw Error(ErrorKind::kInvalidArgument,
                "from_layer_data: no layers given (one entry of keys and values per layer)");
  }
  CacheConfig cfg;
  cfg.options = std::move(options);
  bool any_window = false;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerData& d = layers[i];
    if (d.sliding_window < 0) {
      throw Error(ErrorKind::kInvalidArgument,
                  "from_layer_data: layer " + std::to_string(i) + " has window " +
                      std::to_string(d.sliding_window) + "; use 0 (full attention) or W >= 1");
    }
    if (d.k.ndim() != 4 || d.k.dim(0) != layers[0].k.dim(0)) {
      throw Error(ErrorKind::kInvalidArgument,
                  "from_layer_data: layer " + std::to_string(i) +
                      "'s keys must be [B, H_kv, S, D] with the batch of layer 0 (" +
                      std::to_string(layers[0].k.ndim() == 4 ? layers[0].k.dim(0) : -1) + ")");
    }
    cfg.layer_types.push_back(d.sliding_window > 0 ? "sliding_attention" : "full_attention");
    cfg.layer_windows.push_back(d.sliding_window);
    any_window = any_window || d.sliding_window > 0;
  }
  if (!any_window) cfg.layer_windows.clear();
  auto cache = std::make_unique<Cache>(cfg);
  for (size_t i = 0; i < layers.size(); ++i)
    if (layers[i].k.dim(2) > 0) cache->update(static_cast<int>(i), layers[i].k, layers[i].v);
  cache->invalidate_spans();
  return cache;
}

std::unique_ptr<Cache> Cache::clone() const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i] && split_name(layers_[i]->name()).first == "paged") {
      throw Error(ErrorKind::kUnsupported,
                  "clone(): layer " + std::to_string(i) + " (" + std::string(layers_[i]->name()) +
                      ") keeps its tokens in a paged store shared with other sequences; a copy "
                      "would not be independent of it. Fork the sequence instead "
                      "(repeat_interleave shares its full blocks and copies the last one)");
    }
  }
  if (explicit_layers_) {
    throw Error(ErrorKind::kUnsupported,
                "clone(): this cache was built from explicit layers; clone the layers' "
                "source data (from_layer_data) or build it from a config");
  }
  auto copy = std::make_unique<Cache>(config_);
  MemoryWriter out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    try {
      layers_[i]->save(out);
    } catch (const Error& e) {
      throw Error(ErrorKind::kUnsupported, "clone(): layer " + std::to_string(i) + ": " + e.what());
    }
  }
  MemoryReader in(out.bytes());
  for (auto& l : copy->layers_)
    if (l) l->load(in);
  return copy;
}

KVSpan Cache::stored_kv(int layer) const {
  const CacheLayer& l = this->layer(source_layer(layer));
  KVSpan span;
  if (!l.stored(&span)) {
    throw Error(ErrorKind::kUnsupported,
                "stored_kv: layer " + std::to_string(layer) + " (" + std::string(l.name()) + ") " +
                    (l.is_initialized() ? "does not keep its keys and values as a dense token axis"
                                        : "holds nothing yet (no update since it was built)") +
                    "; the dense containers (dynamic, static, sliding, chunked) can list theirs");
  }
  return span;
}

int64_t Cache::batch_size() const {
  int64_t batch = -1;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!layers_[i]) continue;
    const int64_t b = layers_[i]->batch_rows();
    if (b < 0) continue;
    if (batch >= 0 && b != batch) {
      throw Error(ErrorKind::kInvalidArgument,
                  "batch_size: layer " + std::to_string(i) + " holds " + std::to_string(b) +
                      " rows but an earlier layer holds " + std::to_string(batch) +
                      " (the batch is not consistent across layers)");
    }
    batch = b;
  }
  return batch;
}

std::vector<bool> Cache::is_sliding() const {
  std::vector<bool> out;
  for (const std::string& t : config_.layer_types)
    out.push_back(t == "sliding_attention" || t == "chunked_attention");
  return out;
}

bool Cache::is_compileable() const {
  for (const auto& l : layers_)
    if (l && !l->is_compileable()) return false;
  return true;
}

}  // namespace kvcache
