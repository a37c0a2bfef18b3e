#include "runtime/model_loader.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

#include "core/error.h"
#include "model/dummy.h"
#include "model/gguf.h"
#include "model/llama2c.h"
#include "model/model_file.h"
#include "model/t5.h"
#include "model/tokenizer_llama2c.h"
#include "runtime/builtin_model.h"

namespace kvcache {

namespace {

namespace fs = std::filesystem;

bool starts_with_gguf_magic(const std::string& path) {
  char magic[4] = {};
  std::ifstream f(path, std::ios::binary);
  f.read(magic, 4);
  return f && std::string_view(magic, 4) == "GGUF";
}

// tokenizer_config.json's chat_template: a string, or [{"name": ..., "template": ...}] (the
// "default" entry). Empty when the file or the key is absent.
std::string hf_chat_template(const fs::path& config) {
  std::ifstream f(config);
  if (!f) return "";
  const nlohmann::json j = nlohmann::json::parse(f, nullptr, false);
  if (!j.is_object() || !j.contains("chat_template")) return "";
  const nlohmann::json& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const nlohmann::json& e : t)
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
  }
  return "";
}

std::unique_ptr<Tokenizer> open_tokenizer(const std::string& path, const ModelFile& file) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(ErrorKind::kIo, path + ": tokenizer file not found");
  if (starts_with_gguf_magic(path) || path.ends_with(".json") || fs::is_directory(path, ec)) {
    return load_tokenizer(path);
  }
  return std::make_unique<Llama2cTokenizer>(path, static_cast<int32_t>(file.config().vocab_size));
}

}  // namespace

uint64_t page_in_weights(
    const ModelFile& file,
    const std::function<void(uint64_t done_bytes, uint64_t total_bytes)>& on_progress) {
  // Distinct byte ranges in address order, so the reads stream through each mapping once.
  std::vector<std::pair<const std::byte*, size_t>> ranges;
  for (const auto& [name, view] : file.tensors()) {
    const size_t bytes = dtype_bytes(view.dtype(), view.numel());  // loaders give contiguous views
    if (bytes > 0) ranges.emplace_back(static_cast<const std::byte*>(view.data()), bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
  uint64_t total = 0;
  for (const auto& r : ranges) total += r.second;
  constexpr size_t kPage = 4096;
  uint64_t done = 0, next_report = kProgressChunkBytes;
  for (const auto& [p, n] : ranges) {
    for (size_t off = 0; off < n; off += kPage) {
      (void)*reinterpret_cast<const volatile unsigned char*>(p + off);  // volatile: never elided
      const uint64_t now = done + std::min<uint64_t>(off + kPage, n);
      if (on_progress && now >= next_report) {
        on_progress(now, total);
        next_report = now + kProgressChunkBytes;
      }
    }
    done += n;
  }
  if (on_progress) on_progress(total, total);
  return total;
}

LoadedModel load_model(const std::string& spec, const LoadOptions& options) {
  // Encoder-decoder models (T5) have their own runner (model/t5.h): the decoder-only Model and
  // everything built on it (logits, bench, serve, batch, sessions) cannot run them.
  if (is_encoder_decoder_model(spec))
    throw Error(ErrorKind::kUnsupported,
                spec +
                    " is an encoder-decoder model (T5): only `kvcache generate --encoder-ids "
                    "IDS --output ids` runs it; logits, bench, serve and batch serve "
                    "decoder-only models");
  std::string path = spec;
  if (spec.starts_with("dummy:")) {
    DummyModelOptions d;
    d.preset = spec.substr(6);
    if (const size_t colon = d.preset.find(':'); colon != std::string::npos) {
      d.weight_dtype = parse_dtype(d.preset.substr(colon + 1));
      d.preset.resize(colon);
    }
    d.vocab_gguf = options.dummy_vocab;
    d.cache_dir = options.dummy_cache_dir;
    path = build_dummy_model(d);
  } else if (std::error_code e; !fs::exists(spec, e)) {
    // A built-in model by name ("stories260K"), unless a file of that name is here.
    if (const std::optional<std::string> builtin = builtin_model_path(spec)) path = *builtin;
  }
  std::error_code ec;
  if (!fs::exists(path, ec)) throw Error(ErrorKind::kIo, path + ": no such file or directory");
  std::unique_ptr<ModelFile> file;
  // GGUF (magic), safetensors and HF folders go to the model layer's loader; anything else
  // must be a llama2.c checkpoint (it has no magic), whose header checks then name the problem.
  if (fs::is_directory(path, ec) || starts_with_gguf_magic(path) ||
      path.ends_with(".safetensors")) {
    file = open_model_file(path, options.map_mode);
  } else {
    file = load_llama2c(path, options.map_mode);
  }

  LoadedModel out;
  std::string tok_path = options.tokenizer_path;
  if (tok_path.empty() && file->format() == "llama2c") {
    const fs::path dir = fs::path(path).parent_path();
    for (const char* name : {"tokenizer.bin", "tok512.bin"}) {
      if (fs::exists(dir / name, ec)) {
        tok_path = (dir / name).string();
        break;
      }
    }
  }
  if (file->format() == "gguf") {
    // The vocabulary usually travels inside the GGUF; a weights-only GGUF has none.
    const std::shared_ptr<const GgufFile> g = GgufFile::open(path);
    if (tok_path.empty() && g->find("tokenizer.ggml.model") != nullptr) tok_path = path;
    out.chat_template = g->get_string_or("tokenizer.chat_template", "");
  } else if (tok_path.empty() && fs::is_directory(path, ec) &&
             fs::exists(fs::path(path) / "tokenizer.json", ec)) {
    tok_path = (fs::path(path) / "tokenizer.json").string();
  }
  if (!tok_path.empty()) out.tokenizer = open_tokenizer(tok_path, *file);
  if (out.chat_template.empty() && tok_path.ends_with("tokenizer.json")) {
    out.chat_template =
        hf_chat_template(fs::path(tok_path).parent_path() / "tokenizer_config.json");
  }
  if (out.tokenizer != nullptr && out.tokenizer->vocab_size() > file->config().vocab_size) {
    throw Error(ErrorKind::kFormat, tok_path + ": the tokenizer has " +
                                        std::to_string(out.tokenizer->vocab_size()) +
                                        " tokens but the model's vocabulary is " +
                                        std::to_string(file->config().vocab_size));
  }
  if (out.tokenizer == nullptr && options.require_tokenizer) {
    throw Error(
        ErrorKind::kInvalidArgument,
        path +
            ": no tokenizer found (tokenizer.bin / tok512.bin beside a llama2.c checkpoint, "
            "tokenizer.ggml.* in a GGUF, tokenizer.json in a folder); pass --tokenizer FILE, or "
            "give token ids with --prompt-ids and --output ids");
  }
  out.tokenizer_path = tok_path;
  const ModelConfig& c = file->config();
  if (file->format() == "llama2c") {
    out.stop_ids = {1};
  } else if (c.eos_id >= 0) {
    out.stop_ids = {c.eos_id};
  }
  out.add_bos = file->format() == "llama2c" || c.bos_id >= 0;
  if (options.on_progress && file->weight_bytes() > kProgressMinBytes)
    page_in_weights(*file, options.on_progress);
  out.model = std::make_unique<Model>(std::move(file));
  return out;
}

}  // namespace kvcache
