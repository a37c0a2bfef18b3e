// Hugging Face tokenizer.json (model, vocab, merges, added_tokens, pre_tokenizer, normalizer)
// with the BOS/EOS names of tokenizer_config.json, then encode/decode. Input: tokenizer.json's
// text, optionally followed by a NUL byte and tokenizer_config.json's text.
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"

namespace kvcache::fuzz {

int fuzz_hf_tokenizer(const uint8_t* data, size_t size) {
  const std::string_view all = as_text(data, size);
  const size_t nul = all.find('\0');
  const std::string json(all.substr(0, nul));
  const std::string config(nul == std::string_view::npos ? std::string_view()
                                                         : all.substr(nul + 1));
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = parse_hf_tokenizer(json, config, "fuzz/tokenizer.json");
  } catch (const Error&) {
    return 0;
  }
  exercise_tokenizer(*tok);
  return 0;
}

}  // namespace kvcache::fuzz
