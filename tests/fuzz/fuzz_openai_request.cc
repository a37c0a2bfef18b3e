// OpenAI request bodies: JSON parsed as the server parses it (a syntax error is the server's
// 400, not a finding), then parse_api_request as /v1/completions and as /v1/chat/completions
// under each chat template, for a model with a SentencePiece and one with a byte-level BPE
// tokenizer, and for one without a tokenizer (token-id prompts only). ApiError and
// kvcache::Error are the server's 4xx answers; a nlohmann::json exception escaping the parser
// (a field of an unexpected type) would be a 500 and is a finding.
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "fuzz_targets.h"
#include "fuzz_util.h"
#include "server/openai.h"

namespace kvcache::fuzz {

namespace {

struct Served {
  std::unique_ptr<SpecialTokens> specials;
  ServedModel model;
};

Served served(const Tokenizer* tok) {
  Served s;
  s.model.name = "fuzz-model";
  s.model.tokenizer = tok;
  if (tok != nullptr) {
    s.specials = std::make_unique<SpecialTokens>(*tok);
    s.model.specials = s.specials.get();
    s.model.stop_ids = {tok->eos_id()};
  }
  return s;
}

}  // namespace

int fuzz_openai_request(const uint8_t* data, size_t size) {
  static const Served kModels[] = {served(&tiny_spm_tokenizer()), served(&tiny_bpe_tokenizer()),
                                   served(nullptr)};
  const nlohmann::json body =
      nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) return 0;
  for (const Served& s : kModels) {
    for (const bool chat : {false, true}) {
      for (const ChatTemplate t :
           {ChatTemplate::kChatML, ChatTemplate::kLlama2, ChatTemplate::kLlama3}) {
        if (!chat && t != ChatTemplate::kChatML) break;  // completions ignore the template
        ServedModel m = s.model;
        m.chat_template = t;
        try {
          const ApiRequest r = parse_api_request(body, chat, m);
          (void)response_id(r, 1);
        } catch (const ApiError&) {
        } catch (const Error&) {
        }
      }
    }
  }
  return 0;
}

}  // namespace kvcache::fuzz
