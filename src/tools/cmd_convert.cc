// `kvcache convert`: a llama2.c checkpoint (or any model we load) to GGUF v3 with our writer,
// weights optionally re-encoded (f16, bf16, q8_0, the k-quants, the q4_K_M mix), the llama2.c
// vocabulary embedded as a SentencePiece tokenizer. The result loads here and in
// llama.cpp-compatible tools.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "core/error.h"
#include "model/convert.h"
#include "model/tokenizer_llama2c.h"
#include "runtime/model_loader.h"
#include "tools/commands.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct ConvertOptions {
  std::string model, tokenizer, out, dtype;
};

void run_convert(const CLI::App& cmd, const ConvertOptions& o) {
  check_options(cmd, RunShape{});
  LoadOptions lo;
  lo.tokenizer_path = o.tokenizer;
  LoadedModel lm = load_model(o.model, lo);
  GgufConvertOptions co;
  if (!o.dtype.empty()) parse_convert_dtype(o.dtype, co);
  co.tokenizer = dynamic_cast<const Llama2cTokenizer*>(lm.tokenizer.get());
  RunShape shape;
  shape.embeds_vocab = co.tokenizer != nullptr;
  check_options(cmd, shape);
  if (lm.tokenizer != nullptr && co.tokenizer == nullptr) {
    std::fprintf(stderr, "kvcache: note: only llama2.c vocabularies are embedded; %s is left out\n",
                 lm.tokenizer_path.c_str());
  }
  const GgufConvertReport report = convert_to_gguf(lm.model->file(), co, o.out);
  for (const std::string& f : report.fallbacks) {
    std::fprintf(stderr, "kvcache: note: %s\n", f.c_str());
  }
  std::error_code ec;
  std::fprintf(stderr, "wrote %s (%ju bytes): %s%s\n", o.out.c_str(),
               static_cast<uintmax_t>(std::filesystem::file_size(o.out, ec)),
               lm.model->config().summary().c_str(), co.tokenizer ? " + llama2.c vocabulary" : "");
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertOptions>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert a model (llama2.c .bin) to GGUF v3");
  cmd->add_option("--model,-m", o->model, "Input model (llama2.c checkpoint, GGUF, HF folder)")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "llama2.c tokenizer.bin (default: beside the checkpoint)");
  cmd->add_option("-o,--output", o->out, "Output .gguf path")->required();
  cmd->add_option("--dtype", o->dtype,
                  "Re-encode weight matrices: f32, f16, bf16, q8_0, q2_K..q6_K, or q4_K_M "
                  "(llama.cpp's mix: q4_K, with q6_K for output and some attn_v/ffn_down) "
                  "(default: keep)");
  cmd->callback([o, cmd] { run_convert(*cmd, *o); });
}

}  // namespace kvcache::tools
