// Chat template selection: a model's own Jinja template (GGUF tokenizer.chat_template) is
// recognised as ChatML / Llama-2 / Llama-3, --chat-template overrides it, and an unknown one is
// refused with a message naming what was found and the flag (never a silent fallback).
#include "server/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "model/dummy.h"
#include "model/gguf.h"
#include "runtime/model_loader.h"
#include "scratch_dir.h"

namespace kvcache {
namespace {

// Abridged from the templates these families ship (the markers are what classification reads).
constexpr const char* kChatMLJinja =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}{% endif %}";
constexpr const char* kLlama2Jinja =
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\\n' + "
    "messages[0]['content'] + "
    "'\\n<</SYS>>\\n\\n' %}{% endif %}{% for message in messages %}{% if message['role'] == 'user' "
    "%}"
    "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}"
    "{{ ' ' + message['content'] + ' ' + eos_token }}{% endif %}{% endfor %}";
constexpr const char* kLlama3Jinja =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | "
    "trim + "
    "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ "
    "content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";
constexpr const char* kGemmaJinja =
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\\n' + "
    "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}";

// Template sources from llama.cpp's tests/test-chat-template.cpp (the model named beside each).
// google/gemma-7b-it
constexpr const char* kGemmaItJinja =
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% "
    "endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == "
    "0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') "
    "}}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% "
    "set "
    "role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] "
    "| "
    "trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt "
    "%}{{'<start_of_turn>model\\n'}}{% endif %}";
// Phi-3-mini
constexpr const char* kPhi3Jinja =
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' "
    "+ "
    "'\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif "
    "(message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% "
    "endfor %}";
// mistralai/Mistral-Large-Instruct-2411 (v7)
constexpr const char* kMistralV7Jinja =
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + '[/INST]' }}{% elif message['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' "
    "+ "
    "message['content'] + '[/SYSTEM_PROMPT]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + "
    "message['content'] + eos_token }}{% else %}{{ raise_exception('Only user, system and "
    "assistant roles are supported!') }}{% endif %}{% endfor %}";
// DeepSeek-V2
constexpr const char* kDeepSeek2Jinja =
    "{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif "
    "%}{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ 'User: ' + "
    "message['content'] + '\n\n' }}{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + "
    "message['content'] + eos_token }}{% elif message['role'] == 'system' %}{{ message['content'] "
    "+ "
    "'\n\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}";
// Abridged from DeepSeek-V3's and gpt-oss-20b's tokenizer_config.json (the markers detection
// reads: <｜User｜>/<｜Assistant｜>/<｜end▁of▁sentence｜>; <|start|> and <|channel|>).
constexpr const char* kDeepSeek3Jinja =
    "{% for message in messages %}{% if message['role'] == 'user' "
    "%}{{'<\xEF\xBD\x9CUser\xEF\xBD\x9C>"
    "' + message['content']}}{% endif %}{% if message['role'] == 'assistant' %}{{'<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>' + message['content'] + '<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>'}}{% endif %}{% endfor %}";
constexpr const char* kGptOssJinja =
    "{%- for message in loop_messages -%}{{- \"<|start|>\" + message.role + \"<|channel|>final"
    "<|message|>\" + message.content + \"<|end|>\" }}{%- endfor -%}{%- if add_generation_prompt "
    "-%}<|start|>assistant{%- endif -%}";
// Qwen2.5-style ChatML with tools (abridged): still ChatML.
constexpr const char* kQwenJinja =
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- endif %}{%- for message in messages %}{{- "
    "'<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endfor "
    "%}";
// No family here (Cohere's command-r markers).
constexpr const char* kUnknownJinja =
    "{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + message['content'] + '<|END_OF_TURN_TOKEN|>' }}";

TEST(ChatTemplate, ClassifiesTheFamiliesFromTheirJinja) {
  EXPECT_EQ(classify_chat_template(kChatMLJinja), ChatTemplate::kChatML);
  EXPECT_EQ(classify_chat_template(kQwenJinja), ChatTemplate::kChatML);
  EXPECT_EQ(classify_chat_template(kLlama2Jinja), ChatTemplate::kLlama2);
  EXPECT_EQ(classify_chat_template(kLlama3Jinja), ChatTemplate::kLlama3);
  EXPECT_EQ(classify_chat_template(kGemmaJinja), ChatTemplate::kGemma);
  EXPECT_EQ(classify_chat_template(kGemmaItJinja), ChatTemplate::kGemma);
  EXPECT_EQ(classify_chat_template(kPhi3Jinja), ChatTemplate::kPhi3);
  EXPECT_EQ(classify_chat_template(kMistralV7Jinja), ChatTemplate::kMistralV7);
  EXPECT_EQ(classify_chat_template(kDeepSeek2Jinja), ChatTemplate::kDeepSeek2);
  EXPECT_EQ(classify_chat_template(kDeepSeek3Jinja), ChatTemplate::kDeepSeek3);
  EXPECT_EQ(classify_chat_template(kGptOssJinja), ChatTemplate::kGptOss);
  EXPECT_EQ(classify_chat_template(kUnknownJinja), std::nullopt);
  EXPECT_EQ(classify_chat_template(""), std::nullopt);
}

TEST(ChatTemplate, EveryNameParsesBackAndUnknownNamesListThemAll) {
  for (const ChatTemplate t : all_chat_templates())
    EXPECT_EQ(parse_chat_template(chat_template_name(t)), t) << chat_template_name(t);
  try {
    parse_chat_template("vicuna");
    FAIL() << "an unknown name must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemma, deepseek2, deepseek3, gpt-oss"), std::string::npos)
        << e.what();
  }
}

// system + user + assistant + user + assistant + user: llama.cpp's test conversation.
const std::vector<ChatMessage>& conversation() {
  static const std::vector<ChatMessage> c = {{"system", "You are a helpful assistant"},
                                             {"user", "Hello"},
                                             {"assistant", "Hi there"},
                                             {"user", "Who are you"},
                                             {"assistant", "   I am an assistant   "},
                                             {"user", "Another question"}};
  return c;
}

// Expected strings: llama.cpp's tests/test-chat-template.cpp expected outputs (without the BOS,
// which its tokenizer adds) for the named model, unless a comment says otherwise.
TEST(ChatTemplate, RendersEachFamilyAsLlamaCppExpects) {
  // teknium/OpenHermes-2.5-Mistral-7B
  EXPECT_EQ(render_chat_text(ChatTemplate::kChatML, conversation()),
            "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|"
            "im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are "
            "you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   "
            "<|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n");
  // Llama-3
  EXPECT_EQ(render_chat_text(ChatTemplate::kLlama3, conversation()),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful "
            "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|"
            "start_header_id|>assistant<|end_header_id|>\n\nHi "
            "there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are "
            "you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an "
            "assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother "
            "question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
  // TheBloke/FusionNet_34Bx2_MoE-AWQ, its Jinja output (Meta's format: a BOS per turn).
  EXPECT_EQ(render_chat_text(ChatTemplate::kLlama2, conversation()),
            "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST] Hi there "
            "</s><s>[INST] Who are you [/INST]    I am an assistant    </s><s>[INST] Another "
            "question [/INST]");
  // google/gemma-7b-it: the system text folded into the first user turn.
  EXPECT_EQ(render_chat_text(ChatTemplate::kGemma, conversation()),
            "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_"
            "turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are "
            "you<end_of_turn>\n<start_of_turn>model\nI am an "
            "assistant<end_of_turn>\n<start_of_turn>user\nAnother "
            "question<end_of_turn>\n<start_of_turn>model\n");
  // Phi-3-mini
  EXPECT_EQ(render_chat_text(ChatTemplate::kPhi3, conversation()),
            "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|"
            ">\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an "
            "assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n");
  // mistralai/Mistral-7B-Instruct-v0.2 ('v1' with a system prompt)
  EXPECT_EQ(render_chat_text(ChatTemplate::kMistralV1, conversation()),
            " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you "
            "[/INST]    I am an assistant   </s> [INST] Another question [/INST]");
  // Mistral-Large-Instruct-2407 ('v3')
  EXPECT_EQ(render_chat_text(ChatTemplate::kMistralV3, conversation()),
            "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are "
            "you[/INST] I am an assistant</s>[INST] Another question[/INST]");
  // Mistral-Nemo-Instruct-2407 ('v3-tekken')
  EXPECT_EQ(render_chat_text(ChatTemplate::kMistralV3Tekken, conversation()),
            "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are "
            "you[/INST]   I am an assistant   </s>[INST]Another question[/INST]");
  // mistralai/Mistral-Large-Instruct-2411 ('v7')
  EXPECT_EQ(render_chat_text(ChatTemplate::kMistralV7, conversation()),
            "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi "
            "there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another "
            "question[/INST]");
  // DeepSeek-V2
  EXPECT_EQ(
      render_chat_text(ChatTemplate::kDeepSeek2, conversation()),
      "You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi "
      "there<\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>User: Who are "
      "you\n\nAssistant:    I am an assistant   <\xEF\xBD\x9C"
      "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>User: Another question\n\nAssistant:");
  // DeepSeek-V3: llama.cpp's llm_chat_apply_template text (its test file has no V3 case).
  const std::string ds_user = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>",
                    ds_assistant =
                        "<\xEF\xBD\x9C"
                        "Assistant\xEF\xBD\x9C>",
                    ds_end =
                        "<\xEF\xBD\x9C"
                        "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
  EXPECT_EQ(render_chat_text(ChatTemplate::kDeepSeek3, conversation()),
            "You are a helpful assistant\n\n" + ds_user + "Hello" + ds_assistant + "Hi there" +
                ds_end + ds_user + "Who are you" + ds_assistant + "   I am an assistant   " +
                ds_end + ds_user + "Another question" + ds_assistant);
  // gpt-oss (harmony, minimal): llama.cpp's shape, answers on channel "final" ended by <|end|>
  // as OpenAI's harmony guide writes a history.
  EXPECT_EQ(render_chat_text(ChatTemplate::kGptOss, conversation()),
            "<|start|>system<|message|>You are a helpful "
            "assistant<|end|><|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>"
            "final<|message|>Hi there<|end|><|start|>user<|message|>Who are "
            "you<|end|><|start|>assistant<|channel|>final<|message|>   I am an assistant   "
            "<|end|><|start|>user<|message|>Another question<|end|><|start|>assistant");
}

// A copy of the dummy tiny GGUF (with the shared SentencePiece vocabulary) whose metadata
// carries `jinja` as tokenizer.chat_template; returns its path.
std::string gguf_with_template(const std::string& jinja, const std::string& name) {
  const std::string vocab = std::string(KVCACHE_SHARED_DIR) + "/vocab/ggml-vocab-llama-spm.gguf";
  const std::string dir = testing_util::process_scratch().file("chat_template");
  DummyModelOptions d;
  d.preset = "tiny";
  d.vocab_gguf = vocab;
  d.cache_dir = dir;
  const std::shared_ptr<const GgufFile> src = GgufFile::open(build_dummy_gguf(d));
  GgufWriter w(src->alignment());
  for (const auto& [key, value] : src->metadata()) w.set(key, value);
  w.set("tokenizer.chat_template", GgufValue::str(jinja));
  for (const GgufTensorInfo& t : src->tensor_infos()) w.add_tensor(t.name, src->tensor_view(t));
  const std::string path = dir + "/" + name + ".gguf";
  w.write(path);
  return path;
}

TEST(ChatTemplate, ChosenFromGgufMetadataOverriddenByTheFlagRefusedWhenUnknown) {
  if (!std::filesystem::exists(std::string(KVCACHE_SHARED_DIR) +
                               "/vocab/ggml-vocab-llama-spm.gguf"))
    GTEST_SKIP() << "needs " KVCACHE_SHARED_DIR
                    "/vocab/ggml-vocab-llama-spm.gguf (a tokenizer for the GGUF)";
  const LoadedModel llama3 = load_model(gguf_with_template(kLlama3Jinja, "llama3"));
  ASSERT_NE(llama3.tokenizer, nullptr);
  EXPECT_EQ(llama3.chat_template, kLlama3Jinja);  // read back from the GGUF as written
  // The SentencePiece vocabulary has no <|start_header_id|>: detection from the vocabulary
  // alone would say Llama-2, so Llama-3 here can only come from the metadata.
  EXPECT_EQ(detect_chat_template(*llama3.tokenizer), std::nullopt);
  ChatTemplateChoice c = choose_chat_template("", llama3.chat_template, *llama3.tokenizer);
  EXPECT_EQ(c.tmpl, ChatTemplate::kLlama3);
  EXPECT_EQ(c.source, "the model's chat template");
  c = choose_chat_template("chatml", llama3.chat_template, *llama3.tokenizer);
  EXPECT_EQ(c.tmpl, ChatTemplate::kChatML);
  EXPECT_EQ(c.source, "--chat-template");

  const LoadedModel chatml = load_model(gguf_with_template(kChatMLJinja, "chatml"));
  EXPECT_EQ(choose_chat_template("", chatml.chat_template, *chatml.tokenizer).tmpl,
            ChatTemplate::kChatML);

  const LoadedModel gemma = load_model(gguf_with_template(kGemmaJinja, "gemma"));
  EXPECT_EQ(choose_chat_template("", gemma.chat_template, *gemma.tokenizer).tmpl,
            ChatTemplate::kGemma);

  const LoadedModel unknown = load_model(gguf_with_template(kUnknownJinja, "unknown"));
  c = choose_chat_template("", unknown.chat_template, *unknown.tokenizer);
  EXPECT_EQ(c.tmpl, std::nullopt) << "an unknown template must not be guessed";
  EXPECT_NE(c.error.find("tokenizer.chat_template"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("<|START_OF_TURN_TOKEN|>"), std::string::npos) << c.error;  // quoted
  EXPECT_NE(c.error.find("--chat-template NAME"), std::string::npos) << c.error;     // way out
  EXPECT_NE(c.error.find("chatml, llama2"), std::string::npos) << c.error;
  EXPECT_EQ(choose_chat_template("llama2", unknown.chat_template, *unknown.tokenizer).tmpl,
            ChatTemplate::kLlama2);
  EXPECT_THROW(choose_chat_template("vicuna", unknown.chat_template, *unknown.tokenizer), Error);

  // No template in the metadata and a vocabulary of no family's control tokens: no guess.
  const LoadedModel plain = load_model(gguf_with_template("", "plain"));
  EXPECT_EQ(plain.chat_template, "");
  c = choose_chat_template("", plain.chat_template, *plain.tokenizer);
  EXPECT_EQ(c.tmpl, std::nullopt);
  EXPECT_NE(c.error.find("no chat template"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("--chat-template NAME"), std::string::npos) << c.error;
}

}  // namespace
}  // namespace kvcache
