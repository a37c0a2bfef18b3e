#include "cache/cache.h"

#include <algorithm>
#include <map>
#include <utility>

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
}

bool LayerRegistry::contains(const std::string& implementation, const std::string& layer_type) {
  return registry().count({implementation, layer_type}) > 0;
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
    throw Error(ErrorKind::kUnsupported, "layer " + std::to_string(layer_index) +
                                             ": no cache container for layer type '" + layer_type +
                                             "' with cache implementation '" + implementation +
                                             "'; registered: " + join(names()));
  }
  return it->second(config, layer_index);
}

Cache::Cache(const CacheConfig& config) : config_(config) {
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
  layers_.resize(static_cast<size_t>(n));
  source_.resize(static_cast<size_t>(n));
  last_span_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::string& type = config.layer_types[static_cast<size_t>(i)];
    if (i < first_shared) {
      layers_[static_cast<size_t>(i)] =
          LayerRegistry::create(config.options.implementation, type, config, i);
      source_[static_cast<size_t>(i)] = i;
      continue;
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
  KVSpan span = layers_[static_cast<size_t>(layer)]->update(k, v);
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

MaskSizes Cache::mask_sizes(int layer, int64_t query_len) const {
  return layers_[static_cast<size_t>(source_layer(layer))]->mask_sizes(query_len);
}

int64_t Cache::seq_length(int layer) const {
  return layers_[static_cast<size_t>(source_layer(layer))]->seq_length();
}

int64_t Cache::max_length(int layer) const {
  return layers_[static_cast<size_t>(source_layer(layer))]->max_length();
}

void Cache::invalidate_spans() {
  std::fill(last_span_.begin(), last_span_.end(), KVSpan{});
}

void Cache::crop(int64_t n) {
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

size_t Cache::bytes() const {
  size_t total = 0;
  for (const auto& l : layers_)
    if (l) total += l->bytes();
  return total;
}

}  // namespace kvcache
