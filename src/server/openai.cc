#include "server/openai.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "cache/kv_policy.h"
#include "core/error.h"

namespace kvcache {

using nlohmann::json;

namespace {

ApiError bad(const std::string& message) {
  return ApiError(400, "invalid_request_error", "", message);
}
ApiError too_long(const std::string& message) {
  return ApiError(400, "invalid_request_error", "context_length_exceeded", message);
}

bool given(const json& b, const char* key) {
  const auto it = b.find(key);
  return it != b.end() && !it->is_null();
}

// Typed optional fields: absent or null -> the default; any other type -> 400 naming the field.
int64_t get_int(const json& b, const char* key, int64_t def) {
  const auto it = b.find(key);
  if (it == b.end() || it->is_null()) return def;
  if (!it->is_number_integer()) throw bad(std::string("'") + key + "' must be an integer");
  // JSON integers past int64 arrive unsigned; get<int64_t>() would wrap them negative.
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    throw bad(std::string("'") + key + "' is out of range");
  return it->get<int64_t>();
}
double get_number(const json& b, const char* key, double def) {
  const auto it = b.find(key);
  if (it == b.end() || it->is_null()) return def;
  if (!it->is_number()) throw bad(std::string("'") + key + "' must be a number");
  return it->get<double>();
}
bool get_bool(const json& b, const char* key, bool def) {
  const auto it = b.find(key);
  if (it == b.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw bad(std::string("'") + key + "' must be a boolean");
  return it->get<bool>();
}

// The most prompt tokens a request may have: --max-prompt-tokens, else the context (0: none).
int64_t prompt_token_limit(const RequestLimits& l) {
  if (l.max_prompt_tokens > 0 && l.max_context > 0)
    return std::min(l.max_prompt_tokens, l.max_context);
  return l.max_prompt_tokens > 0 ? l.max_prompt_tokens : l.max_context;
}

// A text of `bytes` bytes encodes to at least bytes / max_text_bytes_per_token() tokens: refuse
// what cannot fit before encode() spends time on it.
void check_text_fits(size_t bytes, const char* what, const ServedModel& m) {
  const int64_t limit = prompt_token_limit(m.limits);
  if (limit <= 0 || m.tokenizer == nullptr) return;
  const size_t per_token = m.tokenizer->max_text_bytes_per_token();
  const auto at_least = static_cast<int64_t>((bytes + per_token - 1) / per_token);
  if (at_least > limit)
    throw too_long(std::string(what) + " has " + std::to_string(bytes) + " bytes, at least " +
                   std::to_string(at_least) + " tokens of this vocabulary (at most " +
                   std::to_string(per_token) + " bytes each); a prompt may have at most " +
                   std::to_string(limit) + " tokens: shorten it");
}

void check_prompt_tokens(size_t tokens, const ServedModel& m) {
  const int64_t limit = prompt_token_limit(m.limits);
  if (limit > 0 && static_cast<int64_t>(tokens) > limit)
    throw too_long("the prompt has " + std::to_string(tokens) + " tokens; at most " +
                   std::to_string(limit) +
                   " are allowed (--max-prompt-tokens or the context): shorten it");
}

std::vector<int32_t> encode_text(const std::string& text, const ServedModel& m) {
  if (m.tokenizer == nullptr)
    throw bad("this model has no tokenizer: send 'prompt' as an array of token ids");
  check_text_fits(text.size(), "'prompt'", m);
  std::vector<int32_t> ids;
  if (m.add_bos && m.tokenizer->bos_id() >= 0) ids.push_back(m.tokenizer->bos_id());
  const std::vector<int32_t> enc = m.tokenizer->encode(text);
  ids.insert(ids.end(), enc.begin(), enc.end());
  return ids;
}

std::vector<int32_t> parse_prompt(const json& b, const ServedModel& m) {
  const auto it = b.find("prompt");
  if (it == b.end() || it->is_null()) throw bad("'prompt' is required");
  const json& p = *it;
  if (p.is_string()) {
    if (p.get<std::string>().empty()) throw bad("'prompt' is empty");
    return encode_text(p.get<std::string>(), m);
  }
  if (p.is_array()) {
    if (p.empty()) throw bad("'prompt' is empty");
    if (p.size() == 1 && p[0].is_string()) {
      if (p[0].get<std::string>().empty()) throw bad("'prompt' is empty");
      return encode_text(p[0].get<std::string>(), m);
    }
    std::vector<int32_t> ids;
    for (const json& e : p) {
      if (!e.is_number_integer())
        throw bad(
            "'prompt' must be a string, an array of token ids, or a batch: an array of strings "
            "or of token-id arrays");
      const auto v = e.get<int64_t>();
      if (v < 0 || v > INT32_MAX)
        throw bad("'prompt' holds token id " + std::to_string(v) + " outside the vocabulary");
      ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
  }
  throw bad("'prompt' must be a string or an array of token ids");
}

// The text of token ids as the engine streams it (Tokenizer::piece_after; BOS adds none);
// offsets[i]: where token i's text starts. Without a tokenizer: no text.
std::string ids_text(std::span<const int32_t> ids, const ServedModel& m,
                     std::vector<size_t>& offsets) {
  offsets.clear();
  std::string text;
  for (size_t i = 0; i < ids.size(); ++i) {
    offsets.push_back(text.size());
    if (m.tokenizer != nullptr) text += m.tokenizer->piece_after(i > 0 ? ids[i - 1] : -1, ids[i]);
  }
  return text;
}

std::vector<ChatMessage> parse_messages(const json& b) {
  const auto it = b.find("messages");
  if (it == b.end() || !it->is_array()) throw bad("'messages' must be an array of {role, content}");
  if (it->empty()) throw bad("'messages' is empty");
  std::vector<ChatMessage> out;
  for (const json& m : *it) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw bad("each message needs a string 'role'");
    for (const auto& [key, value] : m.items()) {
      if (key == "role" || key == "content") continue;
      if (key ==
          "name")  // chat templates here have no place for it; dropping it changes the prompt
        throw bad("message 'name' is not supported by this server; omit it");
      throw bad("unrecognized message field '" + key + "'; messages take 'role' and 'content'");
    }
    ChatMessage cm;
    cm.role = m["role"].get<std::string>();
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" &&
        cm.role != "developer")
      throw bad("unknown message role '" + cm.role + "'");
    if (cm.role == "developer") cm.role = "system";
    const auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      cm.content.clear();
    } else if (c->is_string()) {
      cm.content = c->get<std::string>();
    } else if (c->is_array()) {  // [{"type": "text", "text": ...}]
      for (const json& part : *c) {
        const auto type = part.is_object() ? part.find("type") : part.end();
        if (!part.is_object() || type == part.end() || !type->is_string() || *type != "text" ||
            !part.contains("text") || !part["text"].is_string())
          throw bad("message content parts must be {\"type\": \"text\", \"text\": ...}");
        cm.content += part["text"].get<std::string>();
      }
    } else {
      throw bad("message 'content' must be a string or an array of text parts");
    }
    out.push_back(std::move(cm));
  }
  return out;
}

// OpenAI parameters this server does not implement: refused when they would change the answer
// (a client asking for the prompt echoed must not get a reply without it), accepted at their
// no-op values, which clients often send by default.
void refuse_unsupported(const json& body, bool chat) {
  const auto given = [&](const char* key) -> const json* {
    const auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  const auto refuse = [](const std::string& key) {
    throw bad("'" + key + "' is not supported by this server; omit it (or send its default)");
  };
  for (const char* key : {"presence_penalty", "frequency_penalty"})
    if (const json* v = given(key); v && !(v->is_number() && v->get<double>() == 0.0)) refuse(key);
  if (const json* v = given("logit_bias"); v && !(v->is_object() && v->empty()))
    refuse("logit_bias");
  if (chat) {
    for (const char* key : {"tools", "functions"})
      if (const json* v = given(key); v && !(v->is_array() && v->empty())) refuse(key);
    for (const char* key : {"tool_choice", "function_call"})
      if (const json* v = given(key); v && *v != "none") refuse(key);
    if (const json* v = given("response_format")) {
      const auto type = v->is_object() ? v->find("type") : v->end();
      if (!v->is_object() || type == v->end() || !type->is_string() || *type != "text")
        refuse("response_format");
    }
    if (const json* v = given("modalities"); v && *v != json::array({"text"})) refuse("modalities");
  } else {
    if (const json* v = given("best_of"); v && *v != 1) refuse("best_of");
    if (const json* v = given("suffix"); v && *v != "") refuse("suffix");
  }
}

// Every field a request may carry; anything else is refused, as OpenAI refuses an
// unrecognized argument, so that a misspelt or unimplemented parameter never goes unnoticed.
void refuse_unknown(const json& body, bool chat) {
  static const std::set<std::string, std::less<>> common = {"model",
                                                            "max_tokens",
                                                            "temperature",
                                                            "top_p",
                                                            "top_k",
                                                            "min_p",
                                                            "repetition_penalty",
                                                            "seed",
                                                            "n",
                                                            "stop",
                                                            "stop_token_ids",
                                                            "stream",
                                                            "stream_options",
                                                            "logprobs",
                                                            "ignore_eos",
                                                            "presence_penalty",
                                                            "frequency_penalty",
                                                            "logit_bias",
                                                            "cache_salt",
                                                            "kv_policy",
                                                            "speculative"};
  static const std::set<std::string, std::less<>> completions = {"prompt", "echo", "best_of",
                                                                 "suffix"};
  static const std::set<std::string, std::less<>> chat_only = {
      "messages",    "max_completion_tokens", "top_logprobs",    "tools",     "functions",
      "tool_choice", "function_call",         "response_format", "modalities"};
  for (const auto& item : body.items()) {
    const std::string& key = item.key();  // not a structured binding: clang 14 cannot capture one
    if (common.count(key) != 0 || (chat ? chat_only : completions).count(key) != 0) continue;
    if (std::find_if(std::begin(kIgnoredFields), std::end(kIgnoredFields),
                     [&](const char* f) { return key == f; }) != std::end(kIgnoredFields))
      continue;
    throw bad("unrecognized request argument '" + key + "'" +
              ((chat ? completions : chat_only).count(key) != 0
                   ? std::string(chat ? " (a /v1/completions parameter)"
                                      : " (a /v1/chat/completions parameter)")
                   : std::string()) +
              "; remove it");
  }
}

}  // namespace

std::string to_json_text(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json error_body(const std::string& message, const std::string& type, const std::string& code) {
  return json{{"error",
               {{"message", message},
                {"type", type},
                {"param", nullptr},
                {"code", code.empty() ? json() : json(code)}}}};
}

ApiRequest parse_api_request(const json& body, bool chat, const ServedModel& model) {
  if (!body.is_object()) throw bad("the request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad("'model' must be a string");
    if (it->get<std::string>() != model.name)
      throw ApiError(404, "invalid_request_error", "model_not_found",
                     "The model '" + it->get<std::string>() +
                         "' does not exist; this server serves '" + model.name + "'");
  }
  refuse_unknown(body, chat);
  refuse_unsupported(body, chat);
  RequestParams& p = r.params;
  if (chat) {
    if (model.tokenizer == nullptr)
      throw bad("chat completions need a tokenizer; this model has none");
    if (!model.chat_template)
      throw bad(model.chat_template_error.empty() ? "this server has no chat template"
                                                  : model.chat_template_error);
    const std::vector<ChatMessage> messages = parse_messages(body);
    size_t bytes = 0;
    for (const ChatMessage& m : messages) bytes += m.content.size();
    check_text_fits(bytes, "'messages'", model);
    p.prompt = encode_chat(*model.chat_template, messages, *model.tokenizer, *model.specials);
    const std::vector<int32_t> extra = chat_stop_ids(*model.chat_template, *model.specials);
    p.stop_ids.insert(p.stop_ids.end(), extra.begin(), extra.end());
  } else {
    p.prompt = parse_prompt(body, model);
  }
  if (p.prompt.empty()) throw bad("the prompt encodes to no tokens");
  check_prompt_tokens(p.prompt.size(), model);
  if (!chat) r.echo = get_bool(body, "echo", false);
  const char* max_key =
      chat && given(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const int64_t least = r.echo ? 0 : 1;
  const int64_t context = model.limits.max_context;
  // Without a max_tokens the default shrinks to what the context leaves after the prompt.
  p.max_tokens = given(body, max_key) ? get_int(body, max_key, 0)
                 : context > 0
                     ? std::max(least, std::min(model.default_max_tokens,
                                                context - static_cast<int64_t>(p.prompt.size())))
                     : model.default_max_tokens;
  if (p.max_tokens < least || (context > 0 && p.max_tokens > context))
    throw bad("'" + std::string(max_key) + "' must be in [" + std::to_string(least) + ", " +
              (context > 0 ? std::to_string(context) + "] (the context)" : std::string("...]")) +
              ", got " + std::to_string(p.max_tokens) +
              (r.echo ? "" : " (0 only with \"echo\": true)"));
  if (context > 0 && p.max_tokens > context - static_cast<int64_t>(p.prompt.size()))
    throw too_long("the prompt (" + std::to_string(p.prompt.size()) + " tokens) + '" + max_key +
                   "' (" + std::to_string(p.max_tokens) + ") exceed the context of " +
                   std::to_string(context) + " tokens; shorten the prompt or lower " + max_key);
  p.sampler.temperature = static_cast<float>(get_number(body, "temperature", 1.0));
  if (p.sampler.temperature < 0 || p.sampler.temperature > 2)
    throw bad("'temperature' must be in [0, 2]");
  p.sampler.top_p = static_cast<float>(get_number(body, "top_p", 1.0));
  if (p.sampler.top_p <= 0 || p.sampler.top_p > 1) throw bad("'top_p' must be in (0, 1]");
  const int64_t top_k = get_int(body, "top_k", 0);
  if (top_k < 0 || top_k > INT32_MAX) throw bad("'top_k' must be >= 0 (0: off)");
  p.sampler.top_k = static_cast<int32_t>(top_k);
  p.sampler.min_p = static_cast<float>(get_number(body, "min_p", 0.0));
  if (p.sampler.min_p < 0 || p.sampler.min_p > 1) throw bad("'min_p' must be in [0, 1]");
  p.sampler.repeat_penalty = static_cast<float>(get_number(body, "repetition_penalty", 1.0));
  if (!(p.sampler.repeat_penalty > 0 && std::isfinite(p.sampler.repeat_penalty)))
    throw bad("'repetition_penalty' must be a positive number");
  p.sampler.seed = static_cast<uint64_t>(get_int(body, "seed", 0));
  // Log-probabilities: completions take "logprobs": k; chat "logprobs": true, "top_logprobs": k.
  const std::string k_range = "an integer in [0, " + std::to_string(kMaxTopLogprobs) + "]";
  if (chat) {
    const bool want = get_bool(body, "logprobs", false);
    const int64_t k = get_int(body, "top_logprobs", -1);
    if (k != -1 && (k < 0 || k > kMaxTopLogprobs)) throw bad("'top_logprobs' must be " + k_range);
    if (k >= 0 && !want) throw bad("'top_logprobs' needs \"logprobs\": true");
    p.logprobs = want ? static_cast<int32_t>(std::max<int64_t>(k, 0)) : -1;
  } else {
    const int64_t k = get_int(body, "logprobs", -1);
    if (k != -1 && (k < 0 || k > kMaxTopLogprobs)) throw bad("'logprobs' must be " + k_range);
    p.logprobs = static_cast<int32_t>(k);
  }
  if (r.echo) {
    const auto it = body.find("prompt");
    const std::string decoded = ids_text(p.prompt, model, r.prompt_offsets);
    r.prompt_text = it->is_string()                             ? it->get<std::string>()
                    : (it->size() == 1 && (*it)[0].is_string()) ? (*it)[0].get<std::string>()
                                                                : decoded;
    r.first_piece = logprob_piece(model.tokenizer, p.prompt[0]);
    p.prompt_logprobs = p.logprobs;  // the prompt's scores, when the reply carries logprobs
  }
  const int64_t n = get_int(body, "n", 1);
  if (n < 1 || n > model.limits.max_n)
    throw bad("'n' must be in [1, " + std::to_string(model.limits.max_n) + "] (--max-n), got " +
              std::to_string(n));
  p.n = static_cast<int32_t>(n);
  r.stream = get_bool(body, "stream", false);
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad("'stream_options' must be an object");
    for (const auto& [key, value] : it->items())
      if (key != "include_usage")
        throw bad("unrecognized 'stream_options' field '" + key + "'; remove it");
    r.include_usage = get_bool(*it, "include_usage", false);
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      p.stop_strings.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const json& s : *it) {
        if (!s.is_string()) throw bad("'stop' must be a string or an array of strings");
        p.stop_strings.push_back(s.get<std::string>());
      }
    } else {
      throw bad("'stop' must be a string or an array of strings");
    }
    if (static_cast<int64_t>(p.stop_strings.size()) > model.limits.max_stop_strings)
      throw bad("'stop' has " + std::to_string(p.stop_strings.size()) + " strings; at most " +
                std::to_string(model.limits.max_stop_strings) +
                " are allowed (--max-stop-strings)");
    for (const std::string& s : p.stop_strings) {
      if (s.empty()) throw bad("'stop' strings must not be empty");
      if (static_cast<int64_t>(s.size()) > model.limits.max_stop_bytes)
        throw bad("a 'stop' string has " + std::to_string(s.size()) + " bytes; at most " +
                  std::to_string(model.limits.max_stop_bytes) + " are allowed (--max-stop-bytes)");
    }
    if (!p.stop_strings.empty() && model.tokenizer == nullptr)
      throw bad("'stop' strings need a tokenizer");
  }
  if (const auto it = body.find("stop_token_ids"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) throw bad("'stop_token_ids' must be an array of integers");
    for (const json& s : *it) {
      if (!s.is_number_integer() || s.get<int64_t>() < 0 || s.get<int64_t>() > INT32_MAX ||
          (s.is_number_unsigned() && s.get<uint64_t>() > static_cast<uint64_t>(INT32_MAX)))
        throw bad("'stop_token_ids' must be an array of token ids (integers in [0, 2^31))");
      p.stop_ids.push_back(s.get<int32_t>());
    }
  }
  if (!get_bool(body, "ignore_eos", false))
    p.stop_ids.insert(p.stop_ids.end(), model.stop_ids.begin(), model.stop_ids.end());
  // vLLM's cache_salt: a tenant's prefixes are shared only with requests of the same salt.
  if (const auto it = body.find("cache_salt"); it != body.end() && !it->is_null()) {
    if (!it->is_string() || it->get<std::string>().empty())
      throw bad("'cache_salt' must be a non-empty string");
    p.cache_salt = it->get<std::string>();
    if (p.cache_salt.size() > Engine::kMaxCacheSalt)
      throw bad("'cache_salt' has " + std::to_string(p.cache_salt.size()) + " bytes; at most " +
                std::to_string(Engine::kMaxCacheSalt) + " are allowed");
  }
  // kvcache's: the request's KV eviction policy ("exact", "streaming:sink=4,window=256"); the
  // engine refuses what its store cannot run (Engine::submit), with a 400.
  if (const auto it = body.find("kv_policy"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      throw bad(
          "'kv_policy' must be a string such as \"exact\" or "
          "\"streaming:sink=4,window=256\"");
    try {
      p.kv_policy = KVPolicy::parse(it->get<std::string>());
    } catch (const Error& e) {
      throw bad(std::string("'kv_policy': ") + e.what());
    }
  }
  // kvcache's: speculative decoding on a server started with --spec ngram, per request:
  // {"k": K}, at most K drafts per step (0: off); the engine refuses a k above --spec-k.
  if (const auto it = body.find("speculative"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad("'speculative' must be an object such as {\"k\": 0}");
    for (const auto& item : it->items())
      if (item.key() != "k")
        throw bad("unrecognized 'speculative' field '" + item.key() + "'; it takes \"k\" only");
    const int64_t k = get_int(*it, "k", -1);
    if (k < 0) throw bad("'speculative': 'k' must be an integer >= 0 (0: off)");
    p.spec_k = k;
  }
  return r;
}

std::string openai_finish_reason(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kError:
      return "error";
    default:
      return "stop";
  }
}

std::string response_id(const ApiRequest& req, uint64_t id) {
  return (req.chat ? "chatcmpl-" : "cmpl-") + std::to_string(id);
}

std::vector<ApiRequest> parse_completion_batch(const json& body, const ServedModel& model) {
  const auto p = body.is_object() ? body.find("prompt") : body.end();
  const bool batch = p != body.end() && p->is_array() && !p->empty() &&
                     (p->front().is_array() || (p->front().is_string() && p->size() > 1));
  if (!batch) return {parse_api_request(body, false, model)};
  const int64_t n = get_int(body, "n", 1);
  const auto prompts = static_cast<int64_t>(p->size());
  if (n >= 1 && prompts * n > model.limits.max_n)
    throw bad("a batch of " + std::to_string(prompts) + " prompts x n = " + std::to_string(n) +
              " asks for " + std::to_string(prompts * n) + " samples; at most " +
              std::to_string(model.limits.max_n) + " (--max-n) per request: split the batch");
  std::vector<ApiRequest> out;
  json one = body;
  for (size_t i = 0; i < p->size(); ++i) {
    const json& e = (*p)[i];
    if (!e.is_string() && !e.is_array())
      throw bad(
          "'prompt' is a batch: each entry must be a string or an array of token ids; "
          "prompt[" +
          std::to_string(i) + "] is neither");
    if (e.is_array() && e.size() == 1 && e.front().is_string())
      throw bad("prompt[" + std::to_string(i) + "] must be a string or an array of token ids");
    one["prompt"] = e;
    try {
      out.push_back(parse_api_request(one, false, model));
    } catch (const ApiError& err) {
      throw ApiError(err.status, err.type, err.code,
                     "prompt[" + std::to_string(i) + "]: " + err.what());
    }
  }
  return out;
}

json merge_batch_responses(const std::vector<json>& responses, int32_t n) {
  json merged = responses.at(0);
  merged["choices"] = json::array();
  json& usage = merged["usage"];
  for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"}) usage[k] = 0;
  json& details = usage["prompt_tokens_details"];
  for (auto it = details.begin(); it != details.end(); ++it) *it = 0;
  for (size_t i = 0; i < responses.size(); ++i) {
    for (json c : responses[i]["choices"]) {
      c["index"] = static_cast<int64_t>(i) * n + c["index"].get<int64_t>();
      merged["choices"].push_back(std::move(c));
    }
    const json& u = responses[i]["usage"];
    for (const char* k : {"prompt_tokens", "completion_tokens", "total_tokens"})
      usage[k] = usage[k].get<int64_t>() + u[k].get<int64_t>();
    for (auto it = details.begin(); it != details.end(); ++it)
      *it = it->get<int64_t>() + u["prompt_tokens_details"][it.key()].get<int64_t>();
    if (i > 0 && u.contains("speculative"))
      for (const char* k : {"drafted", "accepted"})
        usage["speculative"][k] =
            usage["speculative"][k].get<int64_t>() + u["speculative"][k].get<int64_t>();
  }
  return merged;
}

json usage_json(const RequestStats& s) {
  json u{{"prompt_tokens", s.prompt_tokens},
         {"completion_tokens", s.completion_tokens},
         {"total_tokens", s.prompt_tokens + s.completion_tokens},
         // cached_tokens is OpenAI's total; the split by tier is kvcache's (the disk
         // tier under the prefix cache, serve --kv-disk; the shared remote tier, serve
         // --kv-remote).
         {"prompt_tokens_details",
          {{"cached_tokens", s.cached_tokens},
           {"cached_tokens_ram", s.cached_tokens - s.cached_tokens_disk - s.cached_tokens_remote},
           {"cached_tokens_disk", s.cached_tokens_disk},
           {"cached_tokens_remote", s.cached_tokens_remote}}},
         // kvcache's: what kept this request's KV — the pages' format and the eviction policy
         // ("exact" when nothing was evicted), so a lossy answer never passes for an exact one.
         {"kv_cache", {{"pages", s.kv_pages}, {"policy", s.kv_policy}}}};
  // kvcache's: speculative decoding's draft tokens verified and accepted (all samples), when
  // the request ran with it; the acceptance rate is accepted / drafted.
  if (s.speculative)
    u["speculative"] = {{"drafted", s.spec_drafted}, {"accepted", s.spec_accepted}};
  return u;
}

json logprobs_json(bool chat, std::span<const TokenLogprob> lps, size_t offset) {
  if (chat) {  // {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob",
               // "bytes"}]}]}
    const auto entry = [](const LogprobEntry& e) {
      json bytes =
          json::array();  // the piece's UTF-8 bytes (a byte token may hold half a character)
      for (const unsigned char ch : e.piece) bytes.push_back(static_cast<int>(ch));
      return json{{"token", e.piece}, {"logprob", e.logprob}, {"bytes", std::move(bytes)}};
    };
    json content = json::array();
    for (const TokenLogprob& t : lps) {
      json c = entry(t.chosen), top = json::array();
      for (const LogprobEntry& e : t.top) top.push_back(entry(e));
      c["top_logprobs"] = std::move(top);
      content.push_back(std::move(c));
    }
    return json{{"content", std::move(content)}};
  }
  // Completions: four parallel arrays; text_offset sums the pieces before each token (the
  // text's byte offset, except after BOS, where the text drops a piece's leading space).
  json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(),
       text_offset = json::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.chosen.piece);
    token_logprobs.push_back(t.chosen.logprob);
    json top = json::object();
    for (const LogprobEntry& e : t.top) top[e.piece] = e.logprob;
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += t.chosen.piece.size();
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_logprobs)},
              {"top_logprobs", std::move(top_logprobs)},
              {"text_offset", std::move(text_offset)}};
}

std::string choice_text(const ApiRequest& req, const RequestOutput& out, size_t i) {
  return req.echo ? req.prompt_text + out.samples[i].text : out.samples[i].text;
}

json echo_logprobs_json(const ApiRequest& req, std::span<const TokenLogprob> prompt_lps,
                        std::span<const TokenLogprob> generated) {
  // The prompt's tokens, then the sample's: the first prompt token has no score (nothing
  // precedes it). The prompt's offsets are where each token's text starts in the decoded
  // prompt (the echoed text when the prompt string round-trips through the tokenizer, as
  // SentencePiece's does), the sample's count on from the echoed text's end.
  json prompt = logprobs_json(false, prompt_lps, 0);
  prompt["tokens"].insert(prompt["tokens"].begin(), req.first_piece);
  prompt["token_logprobs"].insert(prompt["token_logprobs"].begin(), nullptr);
  prompt["top_logprobs"].insert(prompt["top_logprobs"].begin(), nullptr);
  prompt["text_offset"] = req.prompt_offsets;
  const json gen = logprobs_json(false, generated, req.prompt_text.size());
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"})
    for (const json& v : gen[key]) prompt[key].push_back(v);
  return prompt;
}

json choice_logprobs(const ApiRequest& req, const RequestOutput& out, size_t i) {
  if (req.params.logprobs < 0) return nullptr;
  if (!req.echo) return logprobs_json(req.chat, out.samples[i].logprobs, 0);
  return echo_logprobs_json(req, out.prompt_logprobs, out.samples[i].logprobs);
}

json completion_response(const ApiRequest& req, const RequestOutput& out, const std::string& model,
                         int64_t created) {
  json choices = json::array();
  for (size_t i = 0; i < out.samples.size(); ++i) {
    const SampleOutput& s = out.samples[i];
    json c{{"index", i},
           {"finish_reason", openai_finish_reason(s.reason)},
           {"logprobs", choice_logprobs(req, out, i)}};
    if (req.chat) {
      c["message"] = {{"role", "assistant"}, {"content", s.text}};
    } else {
      c["text"] = choice_text(req, out, i);
    }
    choices.push_back(std::move(c));
  }
  return json{{"id", response_id(req, out.id)},
              {"object", req.chat ? "chat.completion" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", std::move(choices)},
              {"usage", usage_json(out.stats)}};
}

json stream_chunk(const ApiRequest& req, uint64_t id, const std::string& model, int64_t created,
                  int32_t index, const std::string& text, const std::string& finish, bool first,
                  std::span<const TokenLogprob> logprobs, size_t text_offset,
                  const std::vector<TokenLogprob>* prompt_logprobs) {
  json c{{"index", index},
         {"finish_reason", finish.empty() ? json() : json(finish)},
         {"logprobs", nullptr}};
  const bool echo = req.echo && first;  // the echoed prompt leads the sample's first chunk
  // A chunk without tokens (the finish chunk, mostly) keeps "logprobs": null.
  if (echo && req.params.logprobs >= 0 && prompt_logprobs != nullptr)
    c["logprobs"] = echo_logprobs_json(req, *prompt_logprobs, logprobs);
  else if (req.params.logprobs >= 0 && !logprobs.empty())
    c["logprobs"] = logprobs_json(req.chat, logprobs, text_offset);
  if (req.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && finish.empty())) delta["content"] = text;
    c["delta"] = std::move(delta);
  } else {
    c["text"] = echo ? req.prompt_text + text : text;
  }
  return json{{"id", response_id(req, id)},
              {"object", req.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({std::move(c)})}};
}

}  // namespace kvcache
