#include "server/chat_template.h"

#include <array>
#include <utility>

#include "core/error.h"

namespace kvcache {

namespace {

// DeepSeek's control tokens use U+FF5C (fullwidth vertical line) and U+2581 (lower block).
constexpr const char* kDsUser = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
constexpr const char* kDsAssistant =
    "<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>";
constexpr const char* kDsEnd =
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";

constexpr const char* kSpecialTexts[] = {"<|im_start|>",
                                         "<|im_end|>",
                                         "<|begin_of_text|>",
                                         "<|start_header_id|>",
                                         "<|end_header_id|>",
                                         "<|eot_id|>",
                                         "<s>",
                                         "</s>",
                                         "[INST]",
                                         "[/INST]",
                                         "[SYSTEM_PROMPT]",
                                         "[/SYSTEM_PROMPT]",
                                         "<start_of_turn>",
                                         "<end_of_turn>",
                                         "<|system|>",
                                         "<|user|>",
                                         "<|assistant|>",
                                         "<|end|>",
                                         "<|start|>",
                                         "<|message|>",
                                         "<|channel|>",
                                         "<|return|>",
                                         "<|call|>",
                                         "<|endoftext|>",
                                         kDsUser,
                                         kDsAssistant,
                                         kDsEnd,
                                         "<bos>",
                                         "<eos>",
                                         "<|constrain|>",
                                         "<|im_sep|>"};

constexpr std::array<std::pair<ChatTemplate, const char*>, 12> kNames = {{
    {ChatTemplate::kChatML, "chatml"},
    {ChatTemplate::kLlama2, "llama2"},
    {ChatTemplate::kLlama3, "llama3"},
    {ChatTemplate::kMistralV1, "mistral-v1"},
    {ChatTemplate::kMistralV3, "mistral-v3"},
    {ChatTemplate::kMistralV3Tekken, "mistral-v3-tekken"},
    {ChatTemplate::kMistralV7, "mistral-v7"},
    {ChatTemplate::kPhi3, "phi3"},
    {ChatTemplate::kGemma, "gemma"},
    {ChatTemplate::kDeepSeek2, "deepseek2"},
    {ChatTemplate::kDeepSeek3, "deepseek3"},
    {ChatTemplate::kGptOss, "gpt-oss"},
}};

enum class SegmentKind { kText, kSpecial, kBos };

struct Segment {
  SegmentKind kind;
  std::string text;
};

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The formats' text follows llama.cpp's llm_chat_apply_template (src/llama-chat.cpp) unless a
// comment says otherwise; the code is this project's.
std::vector<Segment> render(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::vector<Segment> out;
  auto text = [&](std::string s) {
    if (!s.empty()) out.push_back({SegmentKind::kText, std::move(s)});
  };
  auto special = [&](const char* s) { out.push_back({SegmentKind::kSpecial, s}); };
  auto bos = [&] { out.push_back({SegmentKind::kBos, ""}); };
  switch (t) {
    case ChatTemplate::kChatML:
      // <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
      for (const ChatMessage& m : messages) {
        special("<|im_start|>");
        text(m.role + "\n" + m.content);
        special("<|im_end|>");
        text("\n");
      }
      special("<|im_start|>");
      text("assistant\n");
      break;
    case ChatTemplate::kLlama3:
      // <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...
      // (Meta's template trims each content).
      bos();
      for (const ChatMessage& m : messages) {
        special("<|start_header_id|>");
        text(m.role);
        special("<|end_header_id|>");
        text("\n\n" + trim(m.content));
        special("<|eot_id|>");
      }
      special("<|start_header_id|>");
      text("assistant");
      special("<|end_header_id|>");
      text("\n\n");
      break;
    case ChatTemplate::kLlama2: {
      // Meta's format: <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...
      // (the Jinja output of llama.cpp's test for TheBloke/FusionNet_34Bx2_MoE-AWQ).
      std::string system;
      bool open = false;  // an [INST] waits for its answer
      bool first = true;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system += m.content;
        } else if (m.role == "user") {
          std::string body = m.content;
          if (!system.empty()) {
            body = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + body;
            system.clear();
          }
          if (first) {
            bos();
          } else {
            special("<s>");
          }
          first = false;
          text("[INST] " + body + " [/INST]");
          open = true;
        } else {  // assistant
          text(" " + m.content + " ");
          special("</s>");
          open = false;
        }
      }
      if (!open && !system.empty()) {  // only a system message
        if (first) {
          bos();
        } else {
          special("<s>");
        }
        text("[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n [/INST]");
      }
      break;
    }
    case ChatTemplate::kMistralV1:
    case ChatTemplate::kMistralV3:
    case ChatTemplate::kMistralV3Tekken: {
      // Mistral's cookbook (concept-deep-dive/tokenization/chat_templates.md), as llama.cpp
      // renders it: v1 " [INST] ", v3 "[INST] " (assistant trimmed), tekken "[INST]".
      const std::string lead = t == ChatTemplate::kMistralV1 ? " " : "";
      const std::string trail = t == ChatTemplate::kMistralV3Tekken ? "" : " ";
      bos();
      bool inside = false;
      for (const ChatMessage& m : messages) {
        if (!inside) {
          text(lead);
          special("[INST]");
          text(trail);
          inside = true;
        }
        if (m.role == "system") {
          text(m.content + "\n\n");
        } else if (m.role == "user") {
          text(m.content + lead);
          special("[/INST]");
        } else {
          text(trail + (t == ChatTemplate::kMistralV3 ? trim(m.content) : m.content));
          special("</s>");
          inside = false;
        }
      }
      break;
    }
    case ChatTemplate::kMistralV7:
      // Mistral-Large-Instruct-2411's v7 template.
      bos();
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          special("[SYSTEM_PROMPT]");
          text(" " + m.content);
          special("[/SYSTEM_PROMPT]");
        } else if (m.role == "user") {
          special("[INST]");
          text(" " + m.content);
          special("[/INST]");
        } else {
          text(" " + m.content);
          special("</s>");
        }
      }
      break;
    case ChatTemplate::kPhi3:
      // <|role|>\ncontent<|end|>\n ... <|assistant|>\n
      bos();
      for (const ChatMessage& m : messages) {
        special(m.role == "system" ? "<|system|>"
                : m.role == "user" ? "<|user|>"
                                   : "<|assistant|>");
        text("\n" + m.content);
        special("<|end|>");
        text("\n");
      }
      special("<|assistant|>");
      text("\n");
      break;
    case ChatTemplate::kGemma: {
      // Gemma has no system turn: the system text opens the first user turn; "assistant" is
      // "model"; contents are trimmed.
      bos();
      std::string system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system = trim(m.content);
          continue;
        }
        const bool model = m.role == "assistant";
        special("<start_of_turn>");
        std::string body = model ? "model\n" : "user\n";
        if (!system.empty() && !model) {
          body += system + "\n\n";
          system.clear();
        }
        text(body + trim(m.content));
        special("<end_of_turn>");
        text("\n");
      }
      special("<start_of_turn>");
      text("model\n");
      break;
    }
    case ChatTemplate::kDeepSeek2:
      bos();
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          text(m.content + "\n\n");
        } else if (m.role == "user") {
          text("User: " + m.content + "\n\n");
        } else {
          text("Assistant: " + m.content);
          special(kDsEnd);
        }
      }
      text("Assistant:");
      break;
    case ChatTemplate::kDeepSeek3:
      bos();
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          text(m.content + "\n\n");
        } else if (m.role == "user") {
          special(kDsUser);
          text(m.content);
        } else {
          special(kDsAssistant);
          text(m.content);
          special(kDsEnd);
        }
      }
      special(kDsAssistant);
      break;
    case ChatTemplate::kGptOss:
      // Harmony, minimal: llama.cpp's <|start|>role<|message|>content<|end|>, with earlier
      // answers on the "final" channel and ended by <|end|> as OpenAI's harmony guide writes
      // them in a history (<|return|> only ends a generation). No reasoning or tools.
      for (const ChatMessage& m : messages) {
        special("<|start|>");
        text(m.role);
        if (m.role == "assistant") {
          special("<|channel|>");
          text("final");
        }
        special("<|message|>");
        text(m.content);
        special("<|end|>");
      }
      special("<|start|>");
      text("assistant");
      break;
  }
  return out;
}

bool contains(std::string_view s, std::string_view what) {
  return s.find(what) != std::string_view::npos;
}

}  // namespace

std::span<const ChatTemplate> all_chat_templates() {
  static const std::array<ChatTemplate, kNames.size()> all = [] {
    std::array<ChatTemplate, kNames.size()> a{};
    for (size_t i = 0; i < kNames.size(); ++i) a[i] = kNames[i].first;
    return a;
  }();
  return all;
}

std::string chat_template_names() {
  std::string out;
  for (const auto& [t, name] : kNames) out += (out.empty() ? "" : ", ") + std::string(name);
  return out;
}

ChatTemplate parse_chat_template(const std::string& name) {
  for (const auto& [t, n] : kNames)
    if (name == n) return t;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown chat template '" + name + "'; known: " + chat_template_names());
}

const char* chat_template_name(ChatTemplate t) {
  for (const auto& [tt, n] : kNames)
    if (tt == t) return n;
  return "?";
}

SpecialTokens::SpecialTokens(const Tokenizer& tokenizer) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string& t = tokenizer.token_text(id);
    if (t.size() < 3 || (t[0] != '<' && t[0] != '[')) continue;
    for (const char* s : kSpecialTexts)
      if (t == s) ids_.emplace(t, id);
  }
  if (tokenizer.bos_id() >= 0) ids_["<s>"] = tokenizer.bos_id();
  if (tokenizer.eos_id() >= 0) ids_["</s>"] = tokenizer.eos_id();
}

int32_t SpecialTokens::find(const std::string& text) const {
  const auto it = ids_.find(text);
  return it == ids_.end() ? -1 : it->second;
}

std::optional<ChatTemplate> detect_chat_template(const Tokenizer& tokenizer) {
  const SpecialTokens s(tokenizer);
  const auto has = [&](const char* t) { return s.find(t) >= 0; };
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return ChatTemplate::kLlama3;
  if (has("<|im_start|>") && !has("<|im_sep|>")) return ChatTemplate::kChatML;
  if (has("<start_of_turn>")) return ChatTemplate::kGemma;
  if (has("<|start|>") && has("<|channel|>")) return ChatTemplate::kGptOss;
  if (has(kDsUser) && has(kDsAssistant)) return ChatTemplate::kDeepSeek3;
  if (has("<|assistant|>") && has("<|end|>")) return ChatTemplate::kPhi3;
  if (has("[SYSTEM_PROMPT]")) return ChatTemplate::kMistralV7;
  return std::nullopt;
}

std::optional<ChatTemplate> classify_chat_template(std::string_view j) {
  // The markers and their order are llama.cpp's llm_chat_detect_template (src/llama-chat.cpp).
  if (contains(j, "<|im_start|>")) {
    // Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) write <|im_start|> but are not ChatML.
    if (contains(j, "<|im_sep|>") || contains(j, "<end_of_utterance>")) return std::nullopt;
    return ChatTemplate::kChatML;
  }
  if (j.rfind("mistral", 0) == 0 || contains(j, "[INST]")) {
    if (contains(j, "[SYSTEM_PROMPT]")) return ChatTemplate::kMistralV7;
    if (contains(j, "' [INST] ' + system_message") || contains(j, "[AVAILABLE_TOOLS]")) {
      if (contains(j, " [INST]")) return ChatTemplate::kMistralV1;
      if (contains(j, "\"[INST]\"")) return ChatTemplate::kMistralV3Tekken;
      return ChatTemplate::kMistralV3;
    }
    // llama.cpp tells four Llama-2 variants apart (system support, BOS per turn, stripping);
    // here they are one: Meta's format.
    return ChatTemplate::kLlama2;
  }
  if (contains(j, "<|assistant|>") && contains(j, "<|end|>")) return ChatTemplate::kPhi3;
  if (contains(j, "<start_of_turn>")) return ChatTemplate::kGemma;
  if (contains(j, "<|start_header_id|>") && contains(j, "<|end_header_id|>"))
    return ChatTemplate::kLlama3;
  if (contains(j, "'Assistant: ' + message['content'] + eos_token"))
    return ChatTemplate::kDeepSeek2;
  if (contains(j, kDsAssistant) && contains(j, kDsUser) && contains(j, kDsEnd))
    return ChatTemplate::kDeepSeek3;
  if (contains(j, "<|start|>") && contains(j, "<|channel|>")) return ChatTemplate::kGptOss;
  return std::nullopt;
}

ChatTemplateChoice choose_chat_template(const std::string& flag, const std::string& model_template,
                                        const Tokenizer& tokenizer) {
  if (!flag.empty()) return {parse_chat_template(flag), "--chat-template", ""};
  const std::string way_out =
      "; start the server with --chat-template NAME, NAME one of: " + chat_template_names();
  if (!model_template.empty()) {
    if (const std::optional<ChatTemplate> t = classify_chat_template(model_template))
      return {*t, "the model's chat template", ""};
    // Quote the start on one line (templates are multi-line Jinja).
    std::string quote;
    for (char c : model_template.substr(0, 120)) quote += c == '\n' ? ' ' : c;
    return {std::nullopt, "none",
            "the model's chat template (GGUF tokenizer.chat_template or tokenizer_config.json "
            "chat_template, " +
                std::to_string(model_template.size()) + " chars: \"" + quote +
                (model_template.size() > 120 ? "..." : "") + "\") is of no known family" + way_out};
  }
  if (const std::optional<ChatTemplate> t = detect_chat_template(tokenizer))
    return {*t, "vocabulary", ""};
  return {std::nullopt, "none",
          "the model has no chat template (no GGUF tokenizer.chat_template, no "
          "tokenizer_config.json chat_template) and its vocabulary does not tell the format" +
              way_out};
}

std::string render_chat_text(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const Segment& seg : render(t, messages))
    if (seg.kind != SegmentKind::kBos) out += seg.text;
  return out;
}

std::vector<int32_t> encode_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                 const Tokenizer& tokenizer, const SpecialTokens& specials) {
  std::vector<int32_t> ids;
  for (const Segment& seg : render(t, messages)) {
    if (seg.kind == SegmentKind::kBos) {
      if (tokenizer.bos_id() >= 0) ids.push_back(tokenizer.bos_id());
      continue;
    }
    const int32_t id = seg.kind == SegmentKind::kSpecial ? specials.find(seg.text) : -1;
    if (id >= 0) {
      ids.push_back(id);
    } else {
      const std::vector<int32_t> enc = tokenizer.encode(seg.text);
      ids.insert(ids.end(), enc.begin(), enc.end());
    }
  }
  return ids;
}

std::vector<int32_t> chat_stop_ids(ChatTemplate t, const SpecialTokens& specials) {
  std::vector<const char*> names;
  switch (t) {
    case ChatTemplate::kChatML:
      names = {"<|im_end|>"};
      break;
    case ChatTemplate::kLlama3:
      names = {"<|eot_id|>"};
      break;
    case ChatTemplate::kPhi3:
      names = {"<|end|>"};
      break;
    case ChatTemplate::kGemma:
      names = {"<end_of_turn>"};
      break;
    case ChatTemplate::kDeepSeek2:
    case ChatTemplate::kDeepSeek3:
      names = {kDsEnd};
      break;
    case ChatTemplate::kGptOss:
      names = {"<|return|>", "<|call|>"};
      break;
    default:
      names = {"</s>"};
  }
  std::vector<int32_t> ids;
  for (const char* n : names)
    if (const int32_t id = specials.find(n); id >= 0) ids.push_back(id);
  return ids;
}

}  // namespace kvcache
