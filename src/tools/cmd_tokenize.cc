// `kvcache tokenize --model FILE`: reads UTF-8 text from stdin and prints its token ids on one
// line, separated by spaces, without BOS/EOS and with special-token text treated as plain text
// (llama.cpp's test-tokenizer-0 convention). FILE: any GGUF (vocabulary-only files included), a
// tokenizer.json or a HF folder, a llama2.c checkpoint or its tokenizer.bin.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include "model/tokenizer.h"
#include "tools/commands.h"
#include "tools/option_rules.h"

namespace kvcache::tools {

void register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of the UTF-8 text on stdin");
  auto model = std::make_shared<std::string>();
  auto show_pieces = std::make_shared<bool>(false);
  cmd->add_option("--model,-m", *model,
                  "GGUF, tokenizer.json (or its folder), llama2.c checkpoint or tokenizer.bin")
      ->required();
  cmd->add_flag("--pieces", *show_pieces, "Also print each token's text on stderr, one per line");
  cmd->callback([cmd, model, show_pieces] {
    check_options(*cmd, RunShape{});  // every option takes effect
    std::unique_ptr<Tokenizer> tok = load_tokenizer(*model);
    const std::string text((std::istreambuf_iterator<char>(std::cin)),
                           std::istreambuf_iterator<char>());
    const std::vector<int32_t> ids = tok->encode(text);
    std::string line;
    for (int32_t id : ids) {
      if (!line.empty()) line += ' ';
      line += std::to_string(id);
    }
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
    if (*show_pieces) {
      for (int32_t id : ids) std::fprintf(stderr, "%6d -> '%s'\n", id, tok->decode(id).c_str());
    }
  });
}

}  // namespace kvcache::tools
