// Chat templates: OpenAI-style messages -> the prompt text a chat model was trained on. The
// families are recognised from the model's own Jinja template source (GGUF
// `tokenizer.chat_template`, tokenizer_config.json's `chat_template`) by the control text it
// writes, as llama.cpp's llm_chat_detect_template (src/llama-chat.cpp) did before llama.cpp had
// a Jinja engine, and each is rendered by code written here. Why detection and not Jinja: there
// is no C++ Jinja engine in Debian's packages, and the templates of the families served (Llama,
// Mistral, Qwen, Gemma, Phi-3, gpt-oss, DeepSeek) are few and fixed. A template of no known
// family is never guessed: the chat endpoint answers 400 naming --chat-template NAME.
// The rendered prompt is a list of segments, text or special token, so that "<|im_start|>"
// becomes its one token id rather than the characters (Tokenizer::encode treats special-token
// text as plain text).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/tokenizer.h"

namespace kvcache {

enum class ChatTemplate {
  kChatML,           // Qwen2/Qwen3 and others: <|im_start|>role\n...<|im_end|>
  kLlama2,           // Meta's [INST] <<SYS>> format, a BOS per turn
  kLlama3,           // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  kMistralV1,        // " [INST] ... [/INST]", system folded into the user turn
  kMistralV3,        // "[INST] ...[/INST]", assistant text trimmed
  kMistralV3Tekken,  // "[INST]...[/INST]" without spaces
  kMistralV7,        // [SYSTEM_PROMPT] ... [/SYSTEM_PROMPT][INST] ...[/INST]
  kPhi3,             // <|role|>\n...<|end|>\n
  kGemma,            // <start_of_turn>user|model\n...<end_of_turn>\n, system folded into user
  kDeepSeek2,        // DeepSeek-V2 chat: "User: ...\n\nAssistant: ...<｜end▁of▁sentence｜>"
  kDeepSeek3,        // DeepSeek-V2.5/V3/R1: <｜User｜>...<｜Assistant｜>...
  kGptOss,           // OpenAI harmony: <|start|>role<|message|>...<|end|>, answers on channel final
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// Every template with its --chat-template name, in the order help and errors list them.
std::span<const ChatTemplate> all_chat_templates();
// "chatml, llama2, llama3, ..." (for help and error messages).
std::string chat_template_names();
// A --chat-template name -> the template; throws Error(kInvalidArgument) listing the names.
ChatTemplate parse_chat_template(const std::string& name);
const char* chat_template_name(ChatTemplate t);

// From the vocabulary, when its control tokens leave no doubt (<|start_header_id|> -> Llama-3,
// <|im_start|> -> ChatML, <start_of_turn> -> Gemma, ...); nullopt otherwise (a SentencePiece
// vocabulary of plain text cannot tell Llama-2 from Mistral or from a base model).
std::optional<ChatTemplate> detect_chat_template(const Tokenizer& tokenizer);

// Recognises a model's own Jinja chat template by the control text it writes (the order and
// markers of llama.cpp's llm_chat_detect_template). nullopt: none of the families here.
std::optional<ChatTemplate> classify_chat_template(std::string_view jinja);

// The template a server renders with, and why; or, when none can be chosen with certainty,
// the 400 message of every chat request (naming --chat-template NAME and the names).
struct ChatTemplateChoice {
  std::optional<ChatTemplate> tmpl;
  std::string source;  // "--chat-template", "the model's chat template", "vocabulary" or "none"
  std::string error;   // set when tmpl is nullopt
};
// `flag` (--chat-template) wins when given (parse_chat_template: an unknown name throws).
// Else the model's template string, when it has one, must be of a known family; else the
// vocabulary must be certain (detect_chat_template). Otherwise tmpl is nullopt and `error`
// says what was found and the way out: rendering with a guessed format would silently degrade
// every chat answer.
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

// The prompt as text, control tokens written out, without the leading BOS (the form of
// llama.cpp's tests/test-chat-template.cpp expected outputs). For tests and diagnostics.
std::string render_chat_text(ChatTemplate t, const std::vector<ChatMessage>& messages);

// Renders `messages` (+ the assistant's header: add_generation_prompt) and encodes it: special
// tokens by id (the BOS of the templates that start with one: the tokenizer's), text through
// tokenizer.encode. A special token missing from the vocabulary is encoded as text.
std::vector<int32_t> encode_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                 const Tokenizer& tokenizer, const SpecialTokens& specials);
// Extra stop ids of the template (<|im_end|>, <|eot_id|>, <end_of_turn>, ...), when in the
// vocabulary.
std::vector<int32_t> chat_stop_ids(ChatTemplate t, const SpecialTokens& specials);

}  // namespace kvcache
