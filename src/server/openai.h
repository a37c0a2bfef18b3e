// The OpenAI API's request and response JSON (completions and chat completions), kept apart
// from HTTP so that `kvcache batch` and the server share one parser. Bad requests throw
// ApiError carrying the HTTP status and OpenAI's error body fields.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/tokenizer.h"
#include "runtime/engine.h"
#include "server/chat_template.h"

namespace kvcache {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string code, const std::string& message)
      : std::runtime_error(message), status(status), type(std::move(type)), code(std::move(code)) {}
  int status;
  std::string type;  // "invalid_request_error", "authentication_error", ...
  std::string code;  // "model_not_found", "invalid_api_key", ... or empty
};

// Serializes a response. Generated text may hold invalid UTF-8 (a model can emit any byte
// token): it becomes U+FFFD instead of throwing.
std::string to_json_text(const nlohmann::json& j);

// {"error": {"message", "type", "param": null, "code"}}
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& code);

// Bounds on what one request may ask for (serve's flags), each checked before the work it
// bounds: a prompt's bytes before it is tokenized, its tokens before it is queued.
struct RequestLimits {
  int64_t max_prompt_tokens = 0;  // 0: only the context bounds it
  int64_t max_context = 0;        // prompt + max_tokens (the engine's); 0: left to the engine
  int32_t max_n = 64;
  int32_t max_stop_strings = 16;
  int64_t max_stop_bytes = 256;  // per stop string
};

// What the server knows of its model to turn requests into token ids.
struct ServedModel {
  std::string name;                      // the "model" id clients send and /v1/models lists
  const Tokenizer* tokenizer = nullptr;  // nullptr: prompts must be token id arrays
  bool add_bos = true;
  std::vector<int32_t> stop_ids;  // the model's end tokens (always stop)
  // nullopt: no format could be chosen with certainty; chat requests get 400 with
  // chat_template_error (which names --chat-template NAME).
  std::optional<ChatTemplate> chat_template = ChatTemplate::kChatML;
  std::string chat_template_error;
  const SpecialTokens* specials = nullptr;  // with tokenizer
  int64_t default_max_tokens = 16;          // OpenAI's completions default
  RequestLimits limits;
};

struct ApiRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Completions' "echo": the reply's text starts with the prompt (the string sent, or the ids'
  // pieces), and with logprobs its tokens come first in them (the first one with null scores).
  bool echo = false;
  std::string prompt_text;
  std::string first_piece;             // the prompt's first token, as logprobs name it
  std::vector<size_t> prompt_offsets;  // where each prompt token's text starts (text_offset)
  RequestParams params;
};

// Parses a /v1/completions (chat = false) or /v1/chat/completions body. Throws ApiError 400
// for missing or wrongly typed fields, values out of range or past model.limits, an empty
// prompt, a text prompt without tokenizer; 404 for a "model" other than model.name.
// Parameters that would change the answer but are not implemented (logit_bias, penalties
// other than repetition_penalty, tools, cache_salt, ...) are a 400 unless they hold their
// default; fields that cannot change an answer (kIgnoredFields) are accepted and ignored; any
// other field is a 400 naming it, as OpenAI answers an unrecognized argument.
ApiRequest parse_api_request(const nlohmann::json& body, bool chat, const ServedModel& model);
// /v1/completions' batch form (OpenAI's): "prompt" as a list of two or more strings, or a list
// of token-id lists, gives one ApiRequest per prompt, in order, each parsed as
// parse_api_request parses a single prompt (a failing one: its ApiError, the message naming
// prompt[i]). Any other body gives the one parse_api_request result. The answer has n choices
// per prompt, prompt i's sample j at index i * n + j, its usage summed (merge_batch_responses);
// prompts x n must be at most model.limits.max_n.
std::vector<ApiRequest> parse_completion_batch(const nlohmann::json& body,
                                               const ServedModel& model);
// The batch's answer from each prompt's completion_response, in prompt order.
nlohmann::json merge_batch_responses(const std::vector<nlohmann::json>& responses, int32_t n);
// Request fields accepted and ignored: they name or label a request but never change its answer.
inline constexpr const char* kIgnoredFields[] = {"user", "metadata", "store", "service_tier",
                                                 "parallel_tool_calls"};

// Response bodies. created: unix seconds.
nlohmann::json usage_json(const RequestStats& stats);
nlohmann::json completion_response(const ApiRequest& req, const RequestOutput& out,
                                   const std::string& model, int64_t created);
// One streamed chunk (choices[0] = sample `index`). finish: empty while streaming. With
// logprobs requested, the tokens this chunk covers (text_offset: bytes of the sample's text
// before the first of them). With echo, the sample's first chunk starts with the prompt's text
// and, given prompt_logprobs (StreamEvent::prompt_logprobs), its scores (text_offset is then
// the echoed text's length).
nlohmann::json stream_chunk(const ApiRequest& req, uint64_t id, const std::string& model,
                            int64_t created, int32_t index, const std::string& text,
                            const std::string& finish, bool first,
                            std::span<const TokenLogprob> logprobs = {}, size_t text_offset = 0,
                            const std::vector<TokenLogprob>* prompt_logprobs = nullptr);
// OpenAI's "logprobs" object: chat's {"content": [...]}, or completions' tokens /
// token_logprobs / top_logprobs / text_offset arrays (offsets counted from `offset`).
nlohmann::json logprobs_json(bool chat, std::span<const TokenLogprob> logprobs, size_t offset);
// Sample i's text and "logprobs" value (null when not requested) as a reply carries them:
// with echo, the prompt's text and scores first (echo_logprobs_json).
std::string choice_text(const ApiRequest& req, const RequestOutput& out, size_t i);
nlohmann::json choice_logprobs(const ApiRequest& req, const RequestOutput& out, size_t i);
nlohmann::json echo_logprobs_json(const ApiRequest& req,
                                  std::span<const TokenLogprob> prompt_logprobs,
                                  std::span<const TokenLogprob> generated);
std::string response_id(const ApiRequest& req, uint64_t id);  // "cmpl-N" / "chatcmpl-N"
// "length"/"stop" as OpenAI names them (cancelled and error map to "stop"/"error").
std::string openai_finish_reason(FinishReason r);

}  // namespace kvcache
