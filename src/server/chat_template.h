// Chat templates: OpenAI-style messages -> the prompt text a chat model was trained on, for the
// three families built in (ChatML, Llama-2 [INST], Llama-3 header ids). The rendered prompt is
// a list of segments, text or special token, so that "<|im_start|>" becomes its one token id
// rather than the characters (Tokenizer::encode treats special-token text as plain text).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace kvcache {

enum class ChatTemplate { kChatML, kLlama2, kLlama3 };

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;
};

// "chatml", "llama2", "llama3" -> the template; throws Error(kInvalidArgument) otherwise.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate t);
// From the vocabulary: <|start_header_id|> -> Llama-3, <|im_start|> -> ChatML, else Llama-2
// (SentencePiece [INST] needs no special tokens).
ChatTemplate detect_chat_template(const Tokenizer& tokenizer);

// Special-token text -> id for the control tokens the templates use (built once per tokenizer).
class SpecialTokens {
 public:
  explicit SpecialTokens(const Tokenizer& tokenizer);
  int32_t find(const std::string& text) const;  // -1: not in the vocabulary
 private:
  std::unordered_map<std::string, int32_t> ids_;
};

// Renders `messages` (+ the assistant's header: add_generation_prompt) and encodes it: special
// tokens by id (the BOS of Llama-2/3 included), text through tokenizer.encode. A special token
// missing from the vocabulary is encoded as text.
std::vector<int32_t> encode_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                 const Tokenizer& tokenizer, const SpecialTokens& specials);
// Extra stop ids of the template (<|im_end|>, <|eot_id|>), when in the vocabulary.
std::vector<int32_t> chat_stop_ids(ChatTemplate t, const SpecialTokens& specials);

}  // namespace kvcache
