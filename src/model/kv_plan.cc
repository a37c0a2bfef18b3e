#include "model/kv_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"

namespace kvcache {

using nlohmann::json;

const char* plan_layer_kind_name(PlanLayerKind k) {
  switch (k) {
    case PlanLayerKind::kAttention:
      return "attention";
    case PlanLayerKind::kWindowed:
      return "windowed";
    case PlanLayerKind::kMla:
      return "mla";
    case PlanLayerKind::kCompressed:
      return "compressed";
    case PlanLayerKind::kLinear:
      return "linear";
    case PlanLayerKind::kHybrid:
      return "hybrid";
    case PlanLayerKind::kEmpty:
      return "empty";
    case PlanLayerKind::kShared:
      return "shared";
  }
  return "unknown";
}

namespace {

[[noreturn]] void format_error(const std::string& source, const std::string& what) {
  throw Error(ErrorKind::kFormat, source + ": " + what);
}

// A JSON number as an integer: floats truncated (configs write 1e5), values beyond int64
// saturated so that the limit checks see them as too large rather than wrapped around.
int64_t json_to_int(const json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  const double d = v.get<double>();
  if (!(d > -9.2e18)) return INT64_MIN;
  if (!(d < 9.2e18)) return INT64_MAX;
  return static_cast<int64_t>(d);
}

// Integer field that may be absent or null.
std::optional<int64_t> opt_int(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null() || !it->is_number()) return std::nullopt;
  return json_to_int(*it);
}

// A count (layers, heads, sizes, ...): absent, or checked against config_limits.h before the
// planner loops over it or multiplies it.
std::optional<int64_t> opt_count(const json& j, const char* key, ConfigCount kind,
                                 const std::string& source) {
  const std::optional<int64_t> v = opt_int(j, key);
  if (v) check_config_count(source, key, *v, kind);
  return v;
}

std::string opt_str(const json& j, const char* key) {
  auto it = j.find(key);
  return (it != j.end() && it->is_string()) ? it->get<std::string>() : std::string();
}

}  // namespace

namespace {
// The per-layer storage of a decoder layout (from config.json or GGUF metadata alike).
void add_plan_layers(const DecoderLayout& d, PlanModel& m) {
  const int64_t n_layers = d.n_layers, n_kv = d.n_kv_heads, head_dim = d.head_dim;
  const bool mla = d.kv_lora_rank > 0;
  const bool k_eq_v = d.family == "deepseek_v4";  // V4: `self.values = self.keys` (notes)
  // The layer also keeps a copy of the conv window as it was before the update, for the conv
  // kernel (cache/linear_state_layer.h, ConvStateUpdate::previous): billed with the state.
  const int64_t conv_window =
      (d.linear_conv_kernel - 1) *
      (2 * d.linear_heads_k * d.linear_head_dim_k + d.linear_heads_v * d.linear_head_dim_v);
  const int64_t state_elems = d.linear_state_elems > 0 ? d.linear_state_elems + conv_window : 0;
  bool noted_state = false;
  if (state_elems > 0) {
    m.linear = PlanModel::LinearDims{d.linear_heads_k, d.linear_heads_v, d.linear_head_dim_k,
                                     d.linear_head_dim_v, d.linear_conv_kernel};
  }
  for (int64_t i = 0; i < n_layers; ++i) {
    const std::string& t = d.layer_types[static_cast<size_t>(i)];
    PlanLayer L;
    L.type = t;
    L.kv_heads = n_kv;
    L.k_dim = head_dim;
    L.v_dim = k_eq_v ? 0 : head_dim;
    if (i >= n_layers - d.num_kv_shared_layers) {
      L.kind = PlanLayerKind::kShared;
    } else if (auto rate = d.compress_rates.find(t); rate != d.compress_rates.end()) {
      L.kind = PlanLayerKind::kCompressed;
      L.compress_rate = rate->second;
      L.v_dim = 0;  // compressed entries are K==V (notes, CSA/HCA)
      // V4's containers: DeepseekV4HCACache is a sliding K==V layer (W = sliding_window) plus
      // the compressor's state; CSA adds the overlap and the indexer (modeling_deepseek_v4.py).
      L.compressed_window = d.sliding_window;
      L.overlap = t == "compressed_sparse_attention";
      L.stream_width = (L.overlap ? 2 : 1) * head_dim;
      L.index_dim = L.overlap ? d.index_head_dim : 0;
    } else if (t == "full_attention" || t == "deepseek_sparse_attention" ||
               t == "qwen_sparse_attention" || t == "sliding_attention" ||
               t == "chunked_attention") {
      L.kind = PlanLayerKind::kAttention;
      if (t == "sliding_attention" || t == "chunked_attention") {
        // read_decoder_layout refused these types without their window.
        L.kind = PlanLayerKind::kWindowed;
        L.window = t == "sliding_attention" ? d.sliding_window : d.attention_chunk_size;
      }
      if (mla) {
        L.kind = L.kind == PlanLayerKind::kWindowed ? L.kind : PlanLayerKind::kMla;
        L.kv_heads = 1;
        L.k_dim = d.kv_lora_rank + d.qk_rope_head_dim;
        L.v_dim = 0;
      }
    } else if (t == "linear_attention" || t == "conv" || t == "hybrid" || t == "hybrid_sliding") {
      L.kind = (t == "hybrid" || t == "hybrid_sliding") ? PlanLayerKind::kHybrid
                                                        : PlanLayerKind::kLinear;
      L.state_elems = state_elems;
      L.snapshot_elems = d.linear_state_elems;
      if (t == "hybrid_sliding") L.window = d.sliding_window;
      if (state_elems == 0 && !noted_state) {
        noted_state = true;
        m.notes.push_back(
            "linear-attention state size unknown (needs linear_num_value_heads, "
            "linear_num_key_heads, linear_key_head_dim, linear_value_head_dim, "
            "linear_conv_kernel_dim): counted as 0");
      }
    } else {  // moe, mlp: placeholders that store nothing
      L.kind = PlanLayerKind::kEmpty;
    }
    m.layers.push_back(L);
  }
  if (mla) {
    m.mha_equivalent_elems_per_token =
        d.n_heads * (d.qk_nope_head_dim + d.qk_rope_head_dim + d.v_head_dim);
  }
}

PlanModel plan_model_from_hf_json_unchecked(const std::string& json_text,
                                            const std::string& source) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    format_error(source, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!root.is_object()) format_error(source, "a config must be a JSON object");
  // Multimodal configs (Gemma-3n, ...) keep the decoder in text_config.
  const json j = decoder_config(root);
  const DecoderLayout d = read_decoder_layout(root, j, source);
  PlanModel m;
  m.source = source;
  m.name = opt_str(root, "_name_or_path");
  if (m.name.empty()) m.name = d.family.empty() ? "model" : d.family;
  m.max_context = d.max_position_embeddings;
  add_plan_layers(d, m);
  const int64_t n_layers = d.n_layers, n_heads = d.n_heads, n_kv = d.n_kv_heads,
                head_dim = d.head_dim;
  const int64_t hidden = d.hidden_size;
  const bool mla = d.kv_lora_rank > 0;
  const int64_t state_elems = d.linear_state_elems;
  // Parameters: given by our presets, or computed for the dense llama block.
  if (auto p = opt_int(root, "kvcache_params")) {
    m.params = *p;
  } else {
    const bool moe = j.contains("num_experts") || j.contains("n_routed_experts") ||
                     j.contains("num_local_experts");
    const auto ff = opt_count(j, "intermediate_size", ConfigCount::kFfnSize, source);
    const auto vocab = opt_count(j, "vocab_size", ConfigCount::kVocab, source);
    if (!moe && !mla && ff && vocab && hidden > 0 && state_elems == 0 && d.compress_rates.empty()) {
      const bool tied = j.value("tie_word_embeddings", false);
      const int64_t attn = hidden * n_heads * head_dim * 2 + hidden * n_kv * head_dim * 2;
      const int64_t per_layer = attn + 3 * hidden * *ff + 2 * hidden;
      m.params = *vocab * hidden * (tied ? 1 : 2) + n_layers * per_layer + hidden;
    }
  }
  return m;
}
}  // namespace

// A field of the wrong JSON type (a number where a string belongs, ...) is bad input like any
// other: reported as Error(kFormat) naming the file, never as a raw library exception.
PlanModel plan_model_from_hf_json(const std::string& json_text, const std::string& source) {
  try {
    return plan_model_from_hf_json_unchecked(json_text, source);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::kFormat,
                source + ": a field has the wrong JSON type (" + e.what() + ")");
  }
}

PlanModel plan_model_from_config(const ModelConfig& c, const std::string& name) {
  json j;
  j["model_type"] = c.architecture;
  j["num_hidden_layers"] = c.n_layers;
  j["num_attention_heads"] = c.n_heads;
  j["num_key_value_heads"] = c.n_kv_heads;
  j["head_dim"] = c.head_dim > 0 ? c.head_dim : c.dim / c.n_heads;
  j["hidden_size"] = c.dim;
  j["intermediate_size"] = c.hidden_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (c.attention_chunk_size > 0) j["attention_chunk_size"] = c.attention_chunk_size;
  if (!c.layer_types.empty()) j["layer_types"] = c.layer_types;
  if (c.num_kv_shared_layers > 0) j["num_kv_shared_layers"] = c.num_kv_shared_layers;
  if (c.mla.enabled()) {
    j["kv_lora_rank"] = c.mla.kv_lora_rank;
    j["qk_rope_head_dim"] = c.mla.qk_rope_head_dim;
    j["qk_nope_head_dim"] = c.mla.qk_nope_head_dim;
    j["v_head_dim"] = c.mla.v_head_dim;
  }
  if (const LinearAttentionConfig& a = c.linear_attn; a.enabled()) {
    j["linear_num_key_heads"] = a.num_key_heads;
    j["linear_num_value_heads"] = a.num_value_heads;
    j["linear_key_head_dim"] = a.key_head_dim;
    j["linear_value_head_dim"] = a.value_head_dim;
    j["linear_conv_kernel_dim"] = a.conv_kernel;
  }
  if (c.moe.n_experts > 0) j["num_local_experts"] = c.moe.n_experts;  // no dense parameter count
  if (const DeepseekV4Config& v4 = c.deepseek_v4; v4.csa_rate > 0 || v4.hca_rate > 0) {
    // The model's own rates and indexer width, not configuration_deepseek_v4.py's defaults.
    json rates = json::object();
    if (v4.csa_rate > 0) rates["compressed_sparse_attention"] = v4.csa_rate;
    if (v4.hca_rate > 0) rates["heavily_compressed_attention"] = v4.hca_rate;
    j["compress_rates"] = rates;
    j["index_head_dim"] = v4.index_head_dim;
  }
  PlanModel m = plan_model_from_hf_json(j.dump(), name);
  m.name = name;
  return m;
}

PlanModel plan_model_from_gguf(const std::string& path) {
  return plan_model_from_gguf(*GgufFile::open(path));
}

PlanModel plan_model_from_gguf(const GgufFile& g) {
  const std::string& path = g.path();
  const DecoderLayout d = read_decoder_layout(g);
  PlanModel m;
  m.source = path;
  m.max_context = d.max_position_embeddings;
  add_plan_layers(d, m);
  m.name = g.get_string_or("general.name", d.family);
  uint64_t bytes = 0;
  for (const auto& t : g.tensor_infos()) bytes += t.size_bytes;
  if (bytes > 0) m.weight_bytes_exact = bytes;
  return m;
}

PlanModel plan_model_from_path(const std::string& path) {
  std::string p = path;
  {
    std::ifstream probe(p + "/config.json");
    if (probe) p += "/config.json";
  }
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    throw Error(ErrorKind::kIo, path +
                                    ": cannot open (expected a config.json, a folder holding "
                                    "one, or a GGUF file)");
  }
  char magic[4] = {};
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string(magic, 4) == "GGUF") return plan_model_from_gguf(p);
  in.seekg(0);
  std::stringstream ss;
  ss << in.rdbuf();
  return plan_model_from_hf_json(ss.str(), p);
}

double KvFormat::row_bytes(int64_t n) const {
  if (n <= 0) return 0;
  double bytes = static_cast<double>(n) * static_cast<double>(elem_bits) / 8.0;
  if (group > 0) bytes += static_cast<double>((n + group - 1) / group * group_overhead_bytes);
  return bytes;
}

KvFormat parse_kv_format(const std::string& name, int64_t group) {
  if (group <= 0) {
    throw Error(ErrorKind::kInvalidArgument, "--kv-group must be a positive number of elements");
  }
  KvFormat f;
  f.name = name;
  if (name == "f32") {
    f.elem_bits = 32;
  } else if (name == "f16" || name == "bf16") {
    f.elem_bits = 16;
  } else if (name == "f8") {
    f.elem_bits = 8;
  } else if (name == "q8" || name == "q4" || name == "q2") {
    // KIVI-style groups: an f16 scale and an f16 zero point per group of `group` elements.
    f.elem_bits = name == "q8" ? 8 : name == "q4" ? 4 : 2;
    f.group = group;
    f.group_overhead_bytes = 4;
  } else {
    throw Error(ErrorKind::kInvalidArgument,
                "unknown KV dtype '" + name + "': expected f32, f16, bf16, f8, q8, q4 or q2");
  }
  return f;
}

namespace {

// Bytes per stored token of one layer (K and V, or the K==V entry), before compression rates.
double layer_token_bytes(const PlanLayer& L, const KvFormat& f) {
  const double kv = static_cast<double>(L.kv_heads) *
                    (f.row_bytes(L.k_dim) + (L.v_dim > 0 ? f.row_bytes(L.v_dim) : 0.0));
  switch (L.kind) {
    case PlanLayerKind::kAttention:
    case PlanLayerKind::kWindowed:
    case PlanLayerKind::kMla:
    case PlanLayerKind::kHybrid:
    case PlanLayerKind::kCompressed:
      return kv;
    default:
      return 0;
  }
}

// Constant state bytes: the runtime keeps conv windows and recurrent states in f32 whatever the
// KV format (cache/linear_state_layer.h), so the bill does too.
double layer_state_bytes(const PlanLayer& L, const KvFormat&) {
  if (L.kind != PlanLayerKind::kLinear && L.kind != PlanLayerKind::kHybrid) return 0;
  return static_cast<double>(L.state_elems) * static_cast<double>(sizeof(float));
}

int64_t round_up(int64_t n, int64_t m) {
  return m <= 1 ? n : (n + m - 1) / m * m;
}

// Tokens (entries, for compressed layers) one request keeps at `context`.
int64_t stored_tokens(const PlanLayer& L, int64_t context, int64_t block) {
  switch (L.kind) {
    case PlanLayerKind::kAttention:
    case PlanLayerKind::kMla:
    case PlanLayerKind::kHybrid:
      return round_up(L.window > 0 ? std::min(context, L.window - 1) : context, block);
    case PlanLayerKind::kWindowed:
      return round_up(std::min(context, L.window - 1), block);
    case PlanLayerKind::kCompressed:
      return round_up(context / L.compress_rate, block);  // the emitted entries
    default:
      return 0;
  }
}

// What each further token adds to a request once its windows are full.
double layer_growth_bytes(const PlanLayer& L, const KvFormat& f) {
  switch (L.kind) {
    case PlanLayerKind::kAttention:
    case PlanLayerKind::kMla:
    case PlanLayerKind::kHybrid:
      return L.window > 0 ? 0.0 : layer_token_bytes(L, f);
    case PlanLayerKind::kCompressed:
      return (layer_token_bytes(L, f) + f.row_bytes(L.index_dim)) /
             static_cast<double>(L.compress_rate);
    default:
      return 0;
  }
}

// One layer's bytes for one request of `context` tokens.
double layer_request_bytes(const PlanLayer& L, const PlanOptions& o, int64_t context) {
  if (L.kind == PlanLayerKind::kCompressed) return compressed_layer_bill(L, o, context).total();
  return layer_token_bytes(L, o.format) *
             static_cast<double>(stored_tokens(L, context, o.block_tokens)) +
         layer_state_bytes(L, o.format);
}

}  // namespace

CompressedBill compressed_layer_bill(const PlanLayer& L, const PlanOptions& o, int64_t context) {
  CompressedBill c;
  if (L.kind != PlanLayerKind::kCompressed || context <= 0) return c;
  const KvFormat& f = o.format;
  const int64_t r = L.compress_rate;
  const double row = layer_token_bytes(L, f);  // one K==V row of every KV head
  constexpr double kF32 = sizeof(float);       // buffers and overlaps stay f32 (the model's)
  c.window_rows = L.compressed_window > 0
                      ? round_up(std::min(context, L.compressed_window - 1), o.block_tokens)
                      : 0;
  c.entries = stored_tokens(L, context, o.block_tokens);
  c.buffered = context % r;
  c.window = row * static_cast<double>(c.window_rows);
  c.entries_bytes = row * static_cast<double>(c.entries);
  c.index_keys = f.row_bytes(L.index_dim) * static_cast<double>(c.entries);
  // kv and gate rows: the compressor's at stream_width, the indexer's at 2 * index_dim.
  c.buffers = static_cast<double>(c.buffered) * 2.0 *
              static_cast<double>(L.stream_width + 2 * L.index_dim) * kF32;
  if (L.overlap && context >= r)  // the Ca half of the last folded window, kv and gate
    c.overlaps =
        static_cast<double>(r) * 2.0 * static_cast<double>(L.stream_width / 2 + L.index_dim) * kF32;
  return c;
}

double plan_request_bytes(const PlanModel& model, const PlanOptions& o, int64_t context) {
  double total = 0;
  for (const PlanLayer& L : model.layers) total += layer_request_bytes(L, o, context);
  return total;
}

PlanResult compute_plan(const PlanModel& model, const PlanOptions& o) {
  if (o.context < 0 || o.batch < 1 || o.block_tokens < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "plan needs --context >= 0, --batch >= 1 and --block-tokens >= 1");
  }
  PlanResult r;
  std::map<std::string, size_t> index;
  for (const PlanLayer& L : model.layers) {
    auto [it, inserted] = index.emplace(L.type + "/" + plan_layer_kind_name(L.kind), r.rows.size());
    if (inserted) {
      PlanRow row;
      row.type = L.type;
      row.kind = L.kind;
      row.stored_tokens = stored_tokens(L, o.context, o.block_tokens);
      r.rows.push_back(row);
    }
    PlanRow& row = r.rows[it->second];
    row.count += 1;
    const double per_token =
        layer_token_bytes(L, o.format) /
        static_cast<double>(L.kind == PlanLayerKind::kCompressed ? L.compress_rate : 1);
    row.bytes_per_token += per_token;
    row.state_bytes += layer_state_bytes(L, o.format);
    row.total_bytes += static_cast<double>(o.batch) * layer_request_bytes(L, o, o.context);
    r.growth_bytes_per_token += layer_growth_bytes(L, o.format);
    if (L.kind == PlanLayerKind::kCompressed) {
      const CompressedBill c = compressed_layer_bill(L, o, o.context);
      r.compressed.window += c.window;
      r.compressed.entries_bytes += c.entries_bytes;
      r.compressed.index_keys += c.index_keys;
      r.compressed.buffers += c.buffers;
      r.compressed.overlaps += c.overlaps;
    }
    r.kv_bytes_per_token += per_token;
    r.uncompressed_bytes_per_token += layer_token_bytes(L, o.format);
    r.state_bytes_per_request += layer_state_bytes(L, o.format);
    r.snapshot_bytes_each += static_cast<double>(L.snapshot_elems) * sizeof(float);
  }
  if (o.snapshot_every_blocks < 1 || o.max_snapshots < 0) {
    throw Error(ErrorKind::kInvalidArgument,
                "plan needs --snapshot-every-blocks >= 1 and --max-snapshots >= 0");
  }
  r.snapshot_bytes = r.snapshot_bytes_each * static_cast<double>(o.max_snapshots);
  for (const PlanRow& row : r.rows) r.kv_bytes_total += row.total_bytes;
  bool any_compressed = false;
  for (const PlanLayer& L : model.layers) any_compressed |= L.kind == PlanLayerKind::kCompressed;
  if (!any_compressed) r.uncompressed_bytes_per_token = r.growth_bytes_per_token = 0;
  if (model.mha_equivalent_elems_per_token > 0) {
    int64_t mla_layers = 0;
    for (const PlanLayer& L : model.layers) mla_layers += L.kind == PlanLayerKind::kMla;
    r.mha_equivalent_bytes_per_token =
        static_cast<double>(mla_layers) * o.format.row_bytes(model.mha_equivalent_elems_per_token);
  }
  if (model.weight_bytes_exact) {
    r.weight_bytes = static_cast<double>(*model.weight_bytes_exact);
  } else if (model.params) {
    r.weight_bytes = static_cast<double>(*model.params) * o.weight_bytes_per_param;
  }
  if (o.budget_bytes) {
    const double free =
        static_cast<double>(*o.budget_bytes) - r.weight_bytes.value_or(0.0) - r.snapshot_bytes;
    const double per_request = plan_request_bytes(model, o, o.context);
    if (free <= 0) {
      r.max_requests = 0;
      r.max_context = 0;
    } else {
      r.max_requests =
          per_request > 0 ? static_cast<int64_t>(std::floor(free / per_request)) : int64_t{-1};
      auto fits = [&](int64_t s) {
        return static_cast<double>(o.batch) * plan_request_bytes(model, o, s) <= free;
      };
      constexpr int64_t kHuge = int64_t{1} << 40;
      if (fits(kHuge)) {
        r.max_context = -1;  // memory stops growing (windows, states) before the budget
      } else if (!fits(0)) {
        r.max_context = 0;
      } else {
        int64_t lo = 0, hi = kHuge;  // fits(lo), !fits(hi)
        while (hi - lo > 1) {
          const int64_t mid = lo + (hi - lo) / 2;
          (fits(mid) ? lo : hi) = mid;
        }
        r.max_context = lo;
      }
    }
  }
  return r;
}

uint64_t parse_byte_size(const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (...) {
    pos = 0;
  }
  std::string unit = text.substr(pos);
  unit.erase(
      std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return std::isspace(c); }),
      unit.end());
  std::string lower = unit;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"kb", 1e3},
                                                       {"mb", 1e6},
                                                       {"gb", 1e9},
                                                       {"tb", 1e12},
                                                       {"kib", 1024.0},
                                                       {"mib", 1048576.0},
                                                       {"gib", 1073741824.0},
                                                       {"tib", 1099511627776.0},
                                                       {"k", 1024.0},
                                                       {"m", 1048576.0},
                                                       {"g", 1073741824.0}};
  auto it = kUnits.find(lower);
  if (pos == 0 || it == kUnits.end() || !(value >= 0)) {
    throw Error(ErrorKind::kInvalidArgument,
                "cannot read the size '" + text +
                    "': write a number with an optional unit, e.g. 24GiB, 13.4GB, 512MiB");
  }
  // Past 2^63 (and for "inf") llround has no answer: a size no machine has is an error, not a
  // wrapped-around number.
  const double bytes = value * it->second;
  if (!(bytes < 9223372036854775808.0))
    throw Error(ErrorKind::kInvalidArgument,
                "the size '" + text + "' is too large: at most 8 EiB (2^63 bytes)");
  return static_cast<uint64_t>(std::llround(bytes));
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%.0f B", v);
  } else if (std::fabs(v - std::round(v)) < 1e-9) {
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  }
  return buf;
}

}  // namespace kvcache
