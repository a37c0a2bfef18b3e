// llama2.c tokenizer files (tokenizer.bin, tok512.bin): counting whole entries (the vocabulary
// size of a bare tokenizer.bin), loading with that count and with a checkpoint's 512, and
// encode/decode/decode_for_print of the result.
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "model/tokenizer_llama2c.h"

namespace kvcache::fuzz {

int fuzz_llama2c_tokenizer(const uint8_t* data, size_t size) {
  const std::string_view bytes = as_text(data, size);
  const int32_t counted = count_llama2c_tokenizer_entries(bytes);
  for (const int32_t vocab : {counted, 512}) {
    if (vocab <= 0) continue;
    std::unique_ptr<Llama2cTokenizer> tok;
    try {
      tok = std::make_unique<Llama2cTokenizer>("fuzz.bin", bytes, vocab);
    } catch (const Error&) {
      continue;
    }
    exercise_tokenizer(*tok);
    for (int32_t id = 0; id < tok->vocab_size(); ++id) {
      (void)tok->decode_for_print(tok->bos_id(), id);
      (void)tok->score(id);
    }
  }
  return 0;
}

}  // namespace kvcache::fuzz
