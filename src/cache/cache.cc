#include "cache/cache.h"

#include <algorithm>
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

}  // namespace kvcache
