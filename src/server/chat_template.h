// Chat templates: OpenAI-style messages -> the prompt text a chat model was trained on, for the
// three families built in (ChatML, Llama-2 [INST], Llama-3 header ids). The rendered prompt is
// a list of segments, text or special token, so that "<|im_start|>" becomes its one token id
// rather than the characters (Tokenizer::encode treats special-token text as plain text).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace kvcache {

enum class ChatTemplate { kChatML, kLlama2, kLlama3 };

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// "chatml", "llama2", "llama3" -> the template; throws Error(kInvalidArgument) otherwise.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate t);
// From the vocabulary: <|start_header_id|> -> Llama-3, <|im_start|> -> ChatML, else Llama-2
// (SentencePiece [INST] needs no special tokens).
ChatTemplate detect_chat_template(const Tokenizer& tokenizer);

// Recognises a model's own Jinja chat template (GGUF `tokenizer.chat_template`, HF
// tokenizer_config.json `chat_template`) by the control text it writes: "<|start_header_id|>"
// -> Llama-3, "<|im_start|>" -> ChatML, "[INST]" -> Llama-2 (checked in that order: a Llama-3
// template never writes the others). nullopt: none of the built-in families.
std::optional<ChatTemplate> classify_chat_template(std::string_view jinja);

// The template a server renders with, and why.
struct ChatTemplateChoice {
  ChatTemplate tmpl = ChatTemplate::kChatML;
  std::string source;  // "--chat-template", "tokenizer.chat_template" or "vocabulary"
};
// `flag` (--chat-template) wins when given (parse_chat_template). Else the model's template
// string, when it has one, must be of a built-in family: otherwise throws
// Error(kInvalidArgument) quoting the start of what was found and naming --chat-template —
// rendering with a guessed format would silently degrade every chat answer. A model without a
// template string falls back to detect_chat_template (its control tokens).
ChatTemplateChoice choose_chat_template(const std::string& flag, const std::string& model_template,
                                        const Tokenizer& tokenizer);

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
