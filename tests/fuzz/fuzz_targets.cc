#include "fuzz_targets.h"

namespace kvcache::fuzz {

std::span<const Target> all_targets() {
  static const Target kTargets[] = {
      {"gguf", fuzz_gguf},
      {"safetensors", fuzz_safetensors},
      {"llama2c_checkpoint", fuzz_llama2c_checkpoint},
      {"llama2c_tokenizer", fuzz_llama2c_tokenizer},
      {"hf_config", fuzz_hf_config},
      {"hf_tokenizer", fuzz_hf_tokenizer},
      {"openai_request", fuzz_openai_request},
      {"chat_template", fuzz_chat_template},
      {"http", fuzz_http},
  };
  return kTargets;
}

}  // namespace kvcache::fuzz
