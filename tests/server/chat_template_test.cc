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

TEST(ChatTemplate, ClassifiesTheBuiltInFamiliesFromTheirJinja) {
  EXPECT_EQ(classify_chat_template(kChatMLJinja), ChatTemplate::kChatML);
  EXPECT_EQ(classify_chat_template(kLlama2Jinja), ChatTemplate::kLlama2);
  EXPECT_EQ(classify_chat_template(kLlama3Jinja), ChatTemplate::kLlama3);
  EXPECT_EQ(classify_chat_template(kGemmaJinja), std::nullopt);
  EXPECT_EQ(classify_chat_template(""), std::nullopt);
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
  EXPECT_EQ(detect_chat_template(*llama3.tokenizer), ChatTemplate::kLlama2);
  ChatTemplateChoice c = choose_chat_template("", llama3.chat_template, *llama3.tokenizer);
  EXPECT_EQ(c.tmpl, ChatTemplate::kLlama3);
  EXPECT_EQ(c.source, "tokenizer.chat_template");
  c = choose_chat_template("chatml", llama3.chat_template, *llama3.tokenizer);
  EXPECT_EQ(c.tmpl, ChatTemplate::kChatML);
  EXPECT_EQ(c.source, "--chat-template");

  const LoadedModel chatml = load_model(gguf_with_template(kChatMLJinja, "chatml"));
  EXPECT_EQ(choose_chat_template("", chatml.chat_template, *chatml.tokenizer).tmpl,
            ChatTemplate::kChatML);

  const LoadedModel gemma = load_model(gguf_with_template(kGemmaJinja, "gemma"));
  try {
    choose_chat_template("", gemma.chat_template, *gemma.tokenizer);
    FAIL() << "an unknown template must be refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tokenizer.chat_template"), std::string::npos) << msg;
    EXPECT_NE(msg.find("<start_of_turn>"), std::string::npos) << msg;  // quotes what was found
    EXPECT_NE(msg.find("--chat-template"), std::string::npos) << msg;  // and the way out
  }
  EXPECT_EQ(choose_chat_template("llama2", gemma.chat_template, *gemma.tokenizer).tmpl,
            ChatTemplate::kLlama2);
  EXPECT_THROW(choose_chat_template("gemma", gemma.chat_template, *gemma.tokenizer), Error);

  // No template in the metadata: the vocabulary decides (the plain dummy GGUF).
  const LoadedModel plain = load_model(gguf_with_template("", "plain"));
  EXPECT_EQ(plain.chat_template, "");
  c = choose_chat_template("", plain.chat_template, *plain.tokenizer);
  EXPECT_EQ(c.tmpl, ChatTemplate::kLlama2);
  EXPECT_EQ(c.source, "vocabulary");
}

}  // namespace
}  // namespace kvcache
