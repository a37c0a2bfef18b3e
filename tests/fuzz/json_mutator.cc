#include "json_mutator.h"

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace kvcache::fuzz {

namespace {

using nlohmann::json;

// Every node with where it hangs: its parent, and its key (objects) or index (arrays).
struct Node {
  json* value;
  json* parent;  // nullptr for the root
  std::string key;
  size_t index = 0;
};

void collect(json& j, json* parent, const std::string& key, size_t index, std::vector<Node>& nodes,
             std::vector<std::string>& keys) {
  nodes.push_back({&j, parent, key, index});
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      keys.push_back(it.key());
      collect(it.value(), &j, it.key(), 0, nodes, keys);
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) collect(j[i], &j, "", i, nodes, keys);
  }
}

// Values of every JSON type, the ends of the integer ranges and numbers past them.
json random_value(std::mt19937& rng, const std::vector<Node>& nodes) {
  static const char* kScalars[] = {"null",
                                   "true",
                                   "false",
                                   "0",
                                   "-1",
                                   "1",
                                   "2",
                                   "0.5",
                                   "-0.0",
                                   "1e300",
                                   "-1e300",
                                   "65536",
                                   "4294967296",
                                   "9223372036854775807",
                                   "-9223372036854775808",
                                   "18446744073709551615",
                                   "26666666666000000600",
                                   "\"\"",
                                   "\"x\"",
                                   "\"text\"",
                                   "[]",
                                   "{}",
                                   "[1]",
                                   "[\"a\"]",
                                   "{\"type\":\"text\"}"};
  const unsigned pick = rng() % (std::size(kScalars) + 1);
  if (pick < std::size(kScalars)) return json::parse(kScalars[pick]);
  return *nodes[rng() % nodes.size()].value;  // a copy of another node of the document
}

bool mutate_once(json& doc, std::mt19937& rng) {
  std::vector<Node> nodes;
  std::vector<std::string> keys;
  collect(doc, nullptr, "", 0, nodes, keys);
  const Node& n = nodes[rng() % nodes.size()];
  switch (rng() % 4) {
    case 0:  // replace the value
      *n.value = random_value(rng, nodes);
      return true;
    case 1:  // add a key seen anywhere in the document (or an element) with a random value
      if (n.value->is_object() && !keys.empty()) {
        (*n.value)[keys[rng() % keys.size()]] = random_value(rng, nodes);
        return true;
      }
      if (n.value->is_array()) {
        n.value->push_back(random_value(rng, nodes));
        return true;
      }
      return false;
    case 2:  // remove the node
      if (n.parent == nullptr) return false;
      if (n.parent->is_object())
        n.parent->erase(n.key);
      else
        n.parent->erase(n.index);
      return true;
    default:  // duplicate an array element / wrap the node in an array
      if (n.parent != nullptr && n.parent->is_array()) {
        n.parent->push_back(*n.value);
      } else {
        *n.value = json::array({*n.value});
      }
      return true;
  }
}

}  // namespace

size_t mutate_json(uint8_t* data, size_t size, size_t max_size, unsigned int seed,
                   size_t (*byte_mutate)(uint8_t* data, size_t size, size_t max_size)) {
  std::mt19937 rng(seed);
  if (rng() % 2 == 0) return byte_mutate(data, size, max_size);
  const char* text = reinterpret_cast<const char*>(data);
  const size_t nul = std::string_view(text, size).find('\0');
  const size_t json_size = nul == std::string_view::npos ? size : nul;
  json doc = json::parse(text, text + json_size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return byte_mutate(data, size, max_size);
  for (int tries = 0; tries < 4 && !mutate_once(doc, rng); ++tries) {
  }
  const std::string out = doc.dump(-1, ' ', false, json::error_handler_t::replace) +
                          std::string(text + json_size, size - json_size);
  if (out.size() > max_size) return byte_mutate(data, size, max_size);
  std::memcpy(data, out.data(), out.size());
  return out.size();
}

}  // namespace kvcache::fuzz
