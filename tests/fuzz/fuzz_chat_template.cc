// Chat templates: recognising a model's Jinja template (classify_chat_template,
// choose_chat_template with and without a --chat-template flag), the vocabulary fallback, and
// encode_chat of fuzzed messages with every template over both tiny tokenizers.
// Input layout: byte 0 picks the --chat-template flag (bits 0-1: none, chatml, llama2, llama3 —
// 3 also tries an unknown name) and the tokenizer (bit 2: SentencePiece or byte-level BPE); the
// rest splits at NUL bytes into the model's template string and then messages, each a role
// byte (mod 3: system, user, assistant) and its content.
#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "server/chat_template.h"

namespace kvcache::fuzz {

int fuzz_chat_template(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const char* kFlags[] = {"", "chatml", "llama2", "llama3"};
  const std::string flag = kFlags[data[0] & 3];
  std::string_view rest = as_text(data + 1, size - 1);
  std::vector<std::string_view> parts;
  for (size_t nul; (nul = rest.find('\0')) != std::string_view::npos; rest.remove_prefix(nul + 1)) {
    parts.push_back(rest.substr(0, nul));
  }
  parts.push_back(rest);
  const std::string jinja(parts[0]);
  static const char* kRoles[] = {"system", "user", "assistant"};
  std::vector<ChatMessage> messages;
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    messages.push_back(
        {kRoles[static_cast<unsigned char>(parts[i][0]) % 3], std::string(parts[i].substr(1))});
  }

  (void)classify_chat_template(jinja);
  static const SpecialTokens kSpmSpecials(tiny_spm_tokenizer()), kBpeSpecials(tiny_bpe_tokenizer());
  const bool bpe = (data[0] & 4) != 0;
  const Tokenizer& tok = bpe ? tiny_bpe_tokenizer() : tiny_spm_tokenizer();
  const SpecialTokens& specials = bpe ? kBpeSpecials : kSpmSpecials;
  for (const std::string& f : {flag, std::string((data[0] & 3) == 3 ? "mistral" : "")}) {
    try {
      (void)choose_chat_template(f, jinja, tok);
    } catch (const Error&) {
    }
  }
  for (const ChatTemplate t : all_chat_templates()) {
    for (int32_t id : encode_chat(t, messages, tok, specials)) (void)tok.decode(id);
    (void)chat_stop_ids(t, specials);
  }
  return 0;
}

}  // namespace kvcache::fuzz
