#include "model/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "model/hf_config.h"

namespace kvcache {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::kFormat, path + ": " + what);
}

bool parse_dtype_name(const std::string& s, DType* out) {
  if (s == "F32")
    *out = DType::kF32;
  else if (s == "F16")
    *out = DType::kF16;
  else if (s == "BF16")
    *out = DType::kBF16;
  else
    return false;
  return true;
}

const char* dtype_st_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    default:
      return nullptr;
  }
}

}  // namespace

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(const std::string& path,
                                                             MapMode mode) {
  return open(MappedFile(path, mode));
}

std::shared_ptr<const SafetensorsFile> SafetensorsFile::open(MappedFile file) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile(std::move(file)));
  const MappedFile& m = f->file_;
  const std::string& path = m.path();
  uint64_t n = 0;
  std::memcpy(&n, m.at(0, 8, "the header length"), 8);
  if (n > kMaxHeaderBytes)
    bad(path, "safetensors header length " + std::to_string(n) +
                  " is implausible (not a safetensors file?)");
  const char* hdr = reinterpret_cast<const char*>(m.at(8, n, "the JSON header"));
  json j;
  try {
    j = json::parse(hdr, hdr + n);
  } catch (const json::exception& e) {
    bad(path, std::string("safetensors header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad(path, "safetensors header must be a JSON object");
  const uint64_t data_begin = 8 + n;
  const uint64_t data_size = m.size() - data_begin;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) bad(path, "__metadata__ must be an object of strings");
      for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
        if (m2->is_string()) f->metadata_[m2.key()] = m2->get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor '" + name + "'";
    const json& e = *it;
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") ||
        !e.contains("data_offsets") || !e["dtype"].is_string() || !e["shape"].is_array() ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      bad(path, what + " needs dtype (string), shape (list) and data_offsets ([begin, end])");
    }
    DType dt;
    const std::string dts = e["dtype"].get<std::string>();
    // Integer tensors (DeepSeek-V4's tid2eid token -> expert table, int64) are read as f32
    // copies: exact for the small ids they hold, refused past 2^24.
    const int int_bytes = dts == "I64" ? 8 : dts == "I32" ? 4 : 0;
    if (int_bytes == 0 && !parse_dtype_name(dts, &dt)) {
      throw Error(ErrorKind::kUnsupported, path + ": " + what + " has dtype " + dts +
                                               "; supported: F32, F16, BF16 (and I64, I32 read "
                                               "as exact floats)");
    }
    if (int_bytes != 0) dt = DType::kF32;
    const json& shp = e["shape"];
    if (shp.size() > static_cast<size_t>(kMaxDims))
      bad(path, what + " has " + std::to_string(shp.size()) + " dims; at most 4 are supported");
    Shape shape;
    shape.ndim = static_cast<int>(shp.size());
    uint64_t numel = 1;
    for (size_t d = 0; d < shp.size(); ++d) {
      if (!shp[d].is_number_unsigned() || shp[d].get<uint64_t>() > (uint64_t{1} << 40))
        bad(path, what + " has an invalid dimension");
      shape.dims[d] = shp[d].get<int64_t>();
      numel *= shp[d].get<uint64_t>();
      if (numel > (uint64_t{1} << 44)) bad(path, what + " is implausibly large");
    }
    const json& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad(path, what + " has invalid data_offsets");
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    const uint64_t need = numel * (int_bytes != 0 ? static_cast<uint64_t>(int_bytes)
                                                  : static_cast<uint64_t>(dtype_elem_size(dt)));
    if (en < b || en - b != need) {
      bad(path, what + " data_offsets [" + std::to_string(b) + ", " + std::to_string(en) +
                    ") hold " + std::to_string(en - std::min(b, en)) + " bytes but dtype " + dts +
                    " and shape " + shape.str() + " need " + std::to_string(need));
    }
    if (en > data_size) {
      bad(path, "truncated: " + what + " data [" + std::to_string(b) + ", " + std::to_string(en) +
                    ") lies outside the " + std::to_string(data_size) + " data bytes");
    }
    ranges.emplace_back(b, en);
    auto* p = const_cast<std::byte*>(m.data() + data_begin + b);  // read-only mapping
    if (int_bytes != 0) {
      Tensor t = Tensor::empty(DType::kF32, shape);
      float* dst = t.data_as<float>();
      for (uint64_t i = 0; i < numel; ++i) {
        int64_t x = 0;
        if (int_bytes == 8) {
          std::memcpy(&x, p + i * 8, 8);
        } else {
          int32_t y = 0;
          std::memcpy(&y, p + i * 4, 4);
          x = y;
        }
        if (x > (int64_t{1} << 24) || x < -(int64_t{1} << 24))
          bad(path, what + " holds the integer " + std::to_string(x) +
                        ", beyond the 2^24 this reader keeps exactly");
        dst[i] = static_cast<float>(x);
      }
      f->converted_.push_back(std::move(t));
      f->tensors_.emplace(name, f->converted_.back().view());
      continue;
    }
    f->tensors_.emplace(name, TensorView(p, dt, shape));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) bad(path, "tensor data ranges overlap");
  }
  return f;
}

void write_safetensors(const std::string& path,
                       const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const std::set<std::string>& as_int64) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  uint64_t off = 0;
  // Tensors written as I64: their f32 values, rounded.
  std::map<std::string, std::vector<int64_t>> ints;
  for (const auto& [name, v] : tensors) {
    if (!as_int64.count(name)) continue;
    if (v.dtype() != DType::kF32 || !v.is_contiguous())
      throw Error(ErrorKind::kInvalidArgument,
                  "safetensors tensor '" + name + "' written as I64 must be contiguous f32");
    std::vector<int64_t>& out = ints[name];
    for (int64_t i = 0; i < v.numel(); ++i)
      out.push_back(static_cast<int64_t>(std::lround(static_cast<const float*>(v.data())[i])));
  }
  for (const auto& [name, v] : tensors) {
    if (auto it = ints.find(name); it != ints.end()) {
      const uint64_t n = it->second.size() * 8;
      std::vector<int64_t> shape(v.shape().dims.begin(), v.shape().dims.begin() + v.ndim());
      j[name] = {{"dtype", "I64"}, {"shape", shape}, {"data_offsets", {off, off + n}}};
      off += n;
      continue;
    }
    const char* dt = dtype_st_name(v.dtype());
    if (!dt)
      throw Error(ErrorKind::kInvalidArgument, "safetensors cannot store " +
                                                   std::string(dtype_name(v.dtype())) +
                                                   " tensor '" + name + "'");
    if (!v.is_contiguous())
      throw Error(ErrorKind::kInvalidArgument,
                  "safetensors tensor '" + name + "' must be contiguous");
    const uint64_t n = dtype_bytes(v.dtype(), v.numel());
    std::vector<int64_t> shape(v.shape().dims.begin(), v.shape().dims.begin() + v.ndim());
    j[name] = {{"dtype", dt}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string hdr = j.dump();
  hdr.resize((hdr.size() + 7) / 8 * 8, ' ');  // data starts 8-byte aligned, as HF writes it
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error(ErrorKind::kIo, path + ": cannot open for writing");
  const uint64_t n = hdr.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(hdr.data(), static_cast<std::streamsize>(hdr.size()));
  for (const auto& [name, v] : tensors) {
    if (auto it = ints.find(name); it != ints.end()) {
      f.write(reinterpret_cast<const char*>(it->second.data()),
              static_cast<std::streamsize>(it->second.size() * 8));
      continue;
    }
    f.write(static_cast<const char*>(v.data()),
            static_cast<std::streamsize>(dtype_bytes(v.dtype(), v.numel())));
  }
  f.flush();
  if (!f) throw Error(ErrorKind::kIo, path + ": write failed (disk full?)");
}

std::string hf_to_canonical_name(const std::string& n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  static const std::string kPrefix = "model.layers.";
  if (!n.starts_with(kPrefix)) return "";
  size_t i = kPrefix.size(), j = i;
  while (j < n.size() && n[j] >= '0' && n[j] <= '9') ++j;
  if (j == i || j >= n.size() || n[j] != '.') return "";
  const std::string layer = n.substr(i, j - i);
  const std::string rest = n.substr(j + 1);
  static const std::pair<const char*, const char*> kMap[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  for (const auto& [hf, canon] : kMap) {
    if (rest == hf) return "blk." + layer + "." + canon;
  }
  return "";
}

std::vector<std::string> parse_safetensors_index(const std::string& text,
                                                 const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    bad(source, std::string("invalid JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    bad(source, "needs a weight_map object");
  std::vector<std::string> shards;
  std::set<std::string> seen;  // a real index names each of a few shards thousands of times
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) bad(source, "weight_map entry '" + name + "' must name a file");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find("..") != std::string::npos) {
      bad(source, "shard name '" + f + "' must be a plain file name");
    }
    if (seen.insert(f).second) shards.push_back(f);
  }
  if (shards.empty()) bad(source, "weight_map is empty");
  return shards;
}

std::unique_ptr<ModelFile> load_hf_model(const std::string& path, MapMode mode) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(path, ec);
  const fs::path dir = is_dir ? fs::path(path) : fs::path(path).parent_path();
  const fs::path config_path = (dir.empty() ? fs::path(".") : dir) / "config.json";
  if (!fs::exists(config_path, ec)) {
    throw Error(ErrorKind::kIo,
                path + ": no config.json " + (is_dir ? "in this folder" : "beside this file") +
                    " (a Hugging Face model needs config.json with its safetensors)");
  }
  ModelConfig config = load_hf_config(config_path.string());

  std::vector<std::string> shards;
  if (!is_dir) {
    shards.push_back(path);
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    shards.push_back((dir / "model.safetensors").string());
  } else if (fs::exists(dir / "model.safetensors.index.json", ec)) {
    const std::string index_path = (dir / "model.safetensors.index.json").string();
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    for (const std::string& f : parse_safetensors_index(ss.str(), index_path))
      shards.push_back((dir / f).string());
  } else {
    throw Error(ErrorKind::kIo,
                path + ": no model.safetensors or model.safetensors.index.json in this folder");
  }

  std::vector<std::shared_ptr<const SafetensorsFile>> files;
  for (const std::string& shard : shards) files.push_back(SafetensorsFile::open(shard, mode));
  return hf_model_from_safetensors(path, std::move(config), files);
}

std::unique_ptr<ModelFile> hf_model_from_safetensors(
    const std::string& path, ModelConfig config,
    const std::vector<std::shared_ptr<const SafetensorsFile>>& shards) {
  auto mf = std::make_unique<ModelFile>(path, "safetensors");
  mf->mutable_config() = std::move(config);
  // Llama-family names become the canonical GGUF names; other families keep theirs.
  const bool canonical = mf->config().is_llama_family();
  for (const std::shared_ptr<const SafetensorsFile>& sf : shards) {
    for (const auto& [name, view] : sf->tensors()) {
      std::string canon = canonical ? hf_to_canonical_name(name) : std::string();
      // Gemma3nForConditionalGeneration stores the text decoder under model.language_model.
      // (transformers' _checkpoint_conversion_mapping); the vision/audio towers are kept as is.
      static const std::string kLm = "model.language_model.";
      if (!canonical && name.starts_with(kLm)) canon = "model." + name.substr(kLm.size());
      // Gemma3ForConditionalGeneration's Hub checkpoints keep the older language_model.model.*
      // and language_model.lm_head.* (its _checkpoint_conversion_mapping in
      // transformers models/gemma3/modeling_gemma3.py maps them the same way).
      static const std::string kLmOld = "language_model.model.",
                               kHeadOld = "language_model.lm_head.";
      if (!canonical && name.starts_with(kLmOld)) canon = "model." + name.substr(kLmOld.size());
      if (!canonical && name.starts_with(kHeadOld))
        canon = "lm_head." + name.substr(kHeadOld.size());
      // A tied model may still carry lm_head; the canonical set keeps the weight anyway.
      mf->add_tensor(canon.empty() ? name : canon, view);
    }
    mf->keep_alive(sf);
  }
  ModelConfig& c = mf->mutable_config();
  const char* lm_head = canonical ? "output.weight" : "lm_head.weight";
  const char* embed = canonical ? "token_embd.weight" : "model.embed_tokens.weight";
  if (!c.tie_word_embeddings && !mf->find(lm_head) && mf->find(embed)) {
    bad(path, "config.json says tie_word_embeddings=false but there is no lm_head.weight");
  }
  mf->validate_weights();
  return mf;
}

}  // namespace kvcache
