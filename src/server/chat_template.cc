#include "server/chat_template.h"

#include <utility>

#include "core/error.h"

namespace kvcache {

namespace {

constexpr const char* kSpecialTexts[] = {"<|im_start|>",
                                         "<|im_end|>",
                                         "<|begin_of_text|>",
                                         "<|start_header_id|>",
                                         "<|end_header_id|>",
                                         "<|eot_id|>",
                                         "<s>",
                                         "</s>"};

struct Segment {
  bool special;
  std::string text;
};

std::vector<Segment> render(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  std::vector<Segment> out;
  auto text = [&](std::string s) { out.push_back({false, std::move(s)}); };
  auto special = [&](const char* s) { out.push_back({true, s}); };
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
      special("<|begin_of_text|>");
      for (const ChatMessage& m : messages) {
        special("<|start_header_id|>");
        text(m.role);
        special("<|end_header_id|>");
        text("\n\n" + m.content);
        special("<|eot_id|>");
      }
      special("<|start_header_id|>");
      text("assistant");
      special("<|end_header_id|>");
      text("\n\n");
      break;
    case ChatTemplate::kLlama2: {
      // Meta's format: <s>[INST] <<SYS>>\nsys\n<</SYS>>\n\nuser [/INST] answer </s><s>[INST] ...
      std::string system;
      bool open = false;  // an [INST] waits for its answer
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system += m.content;
        } else if (m.role == "user") {
          std::string body = m.content;
          if (!system.empty()) {
            body = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + body;
            system.clear();
          }
          special("<s>");
          text("[INST] " + body + " [/INST]");
          open = true;
        } else {  // assistant
          text(" " + m.content + " ");
          special("</s>");
          open = false;
        }
      }
      if (!open && !system.empty()) {  // only a system message
        special("<s>");
        text("[INST] <<SYS>>\n" + system + "\n<</SYS>>\n\n [/INST]");
      }
      break;
    }
  }
  return out;
}

}  // namespace

ChatTemplate parse_chat_template(const std::string& name) {
  if (name == "chatml") return ChatTemplate::kChatML;
  if (name == "llama2") return ChatTemplate::kLlama2;
  if (name == "llama3") return ChatTemplate::kLlama3;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown chat template '" + name + "'; known: chatml, llama2, llama3");
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::kChatML:
      return "chatml";
    case ChatTemplate::kLlama2:
      return "llama2";
    case ChatTemplate::kLlama3:
      return "llama3";
  }
  return "chatml";
}

SpecialTokens::SpecialTokens(const Tokenizer& tokenizer) {
  for (int32_t id = 0; id < tokenizer.vocab_size(); ++id) {
    const std::string& t = tokenizer.token_text(id);
    if (t.size() < 3 || t[0] != '<') continue;
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

ChatTemplate detect_chat_template(const Tokenizer& tokenizer) {
  const SpecialTokens s(tokenizer);
  if (s.find("<|start_header_id|>") >= 0) return ChatTemplate::kLlama3;
  if (s.find("<|im_start|>") >= 0) return ChatTemplate::kChatML;
  return ChatTemplate::kLlama2;
}

std::optional<ChatTemplate> classify_chat_template(std::string_view jinja) {
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate::kLlama3;
  if (jinja.find("<|im_start|>") != std::string_view::npos) return ChatTemplate::kChatML;
  if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplate::kLlama2;
  return std::nullopt;
}

ChatTemplateChoice choose_chat_template(const std::string& flag, const std::string& model_template,
                                        const Tokenizer& tokenizer) {
  if (!flag.empty()) return {parse_chat_template(flag), "--chat-template"};
  if (!model_template.empty()) {
    if (const std::optional<ChatTemplate> t = classify_chat_template(model_template)) {
      return {*t, "tokenizer.chat_template"};
    }
    // Quote the start on one line (templates are multi-line Jinja).
    std::string quote;
    for (char c : model_template.substr(0, 120)) quote += c == '\n' ? ' ' : c;
    throw Error(
        ErrorKind::kInvalidArgument,
        "the model's chat template (tokenizer.chat_template, " +
            std::to_string(model_template.size()) + " chars: \"" + quote +
            (model_template.size() > 120 ? "..." : "") +
            "\") is none of the built-in families (ChatML <|im_start|>, Llama-2 [INST], Llama-3 "
            "<|start_header_id|>); pass --chat-template chatml, llama2 or llama3 to choose the "
            "format");
  }
  return {detect_chat_template(tokenizer), "vocabulary"};
}

std::vector<int32_t> encode_chat(ChatTemplate t, const std::vector<ChatMessage>& messages,
                                 const Tokenizer& tokenizer, const SpecialTokens& specials) {
  std::vector<int32_t> ids;
  for (const Segment& seg : render(t, messages)) {
    const int32_t id = seg.special ? specials.find(seg.text) : -1;
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
  const char* name = t == ChatTemplate::kChatML   ? "<|im_end|>"
                     : t == ChatTemplate::kLlama3 ? "<|eot_id|>"
                                                  : "</s>";
  const int32_t id = specials.find(name);
  return id >= 0 ? std::vector<int32_t>{id} : std::vector<int32_t>{};
}

}  // namespace kvcache
