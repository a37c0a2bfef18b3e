#include "fuzz_util.h"

#include <cstdio>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_spm.h"
#include "model/unicode.h"
#include "model/vocabulary.h"

namespace kvcache::fuzz {

namespace {

constexpr const char* kControlTexts[] = {"<unk>",
                                         "<s>",
                                         "</s>",
                                         "<|im_start|>",
                                         "<|im_end|>",
                                         "<|begin_of_text|>",
                                         "<|start_header_id|>",
                                         "<|end_header_id|>",
                                         "<|eot_id|>"};

void add(Vocabulary& v, std::string text, TokenType type, float score = 0.0f) {
  v.tokens.push_back(std::move(text));
  v.types.push_back(type);
  v.scores.push_back(score);
}

// unk 0, bos 1, eos 2, then the chat control tokens, one user-defined token, the words.
Vocabulary control_tokens() {
  Vocabulary v;
  for (const char* t : kControlTexts)
    add(v, t, t == std::string_view("<unk>") ? TokenType::kUnknown : TokenType::kControl);
  v.unk = 0;
  v.bos = 1;
  v.eos = 2;
  add(v, "<tool>", TokenType::kUserDefined);
  return v;
}

}  // namespace

void exercise_tokenizer(const Tokenizer& tok) {
  using namespace std::string_view_literals;
  static const std::string_view kTexts[] = {
      "",
      "Hello world",
      " leading,  double  spaces\n\ttabs\r\n",
      "h\xC3\xA9llo w\xC3\xB6rld \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\xA6\x99",
      "\xFF\xFE\x80 \xC3 \xE4\xBD \0 end"sv,  // invalid and cut UTF-8, a NUL
      "<s></s><|im_start|>user<|im_end|><tool><0x41>",
      "they're it's we'LL 1234567 a1b2 !!! ...",
  };
  const int32_t n = tok.vocab_size();
  for (std::string_view text : kTexts) {
    std::vector<int32_t> ids;
    try {
      ids = tok.encode(text);  // may refuse, e.g. a llama2.c vocabulary without byte tokens
    } catch (const Error&) {
      continue;
    }
    for (int32_t id : ids) {
      // An id outside the vocabulary is a finding: decode would refuse what encode produced.
      if (id < 0 || id >= n)
        throw std::logic_error("encode produced id " + std::to_string(id) +
                               " outside the vocabulary");
      (void)tok.decode(id);
    }
  }
  for (int32_t id = 0; id < n; ++id) {
    (void)tok.decode(id);
    (void)tok.token_text(id);
    (void)tok.piece_after(tok.bos_id(), id);
  }
}

Vocabulary tiny_spm_vocabulary() {
  Vocabulary v = control_tokens();
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    add(v, name, TokenType::kByte);
  }
  // Pieces and merges (higher score merges first), in SentencePiece's U+2581 spelling.
  const char* kPieces[] = {"\xE2\x96\x81",
                           "h",
                           "e",
                           "l",
                           "o",
                           "w",
                           "r",
                           "d",
                           "t",
                           "a",
                           "s",
                           "i",
                           "n",
                           "u",
                           "he",
                           "ll",
                           "llo",
                           "\xE2\x96\x81h",
                           "\xE2\x96\x81he",
                           "\xE2\x96\x81hello",
                           "or",
                           "ld",
                           "\xE2\x96\x81w",
                           "\xE2\x96\x81wor",
                           "\xE2\x96\x81world",
                           "us",
                           "er",
                           "as",
                           "ss",
                           "ant",
                           "is",
                           "\xE2\x96\x81\xE2\x96\x81",
                           "\xE4\xBD\xA0"};
  float score = 0.0f;
  for (const char* p : kPieces) add(v, p, TokenType::kNormal, score += 0.5f);
  return v;
}

std::vector<std::pair<std::string, std::string>> tiny_bpe_merges() {
  std::string space;  // GPT-2's printable stand-in for ' ' ("\u0120")
  append_utf8(space, byte_to_unicode(' '));
  return {{"h", "e"},
          {"l", "l"},
          {"ll", "o"},
          {space, "he"},
          {"he", "llo"},
          {space, "hello"},
          {"o", "r"},
          {"w", "or"},
          {space, "wor"},
          {"l", "d"},
          {space + "wor", "ld"},
          {"'", "s"},
          {"1", "2"}};
}

Vocabulary tiny_bpe_vocabulary() {
  Vocabulary v = control_tokens();
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, byte_to_unicode(static_cast<uint8_t>(b)));
    add(v, s, TokenType::kNormal);
  }
  for (const auto& [a, b] : tiny_bpe_merges()) add(v, a + b, TokenType::kNormal);
  return v;
}

const Tokenizer& tiny_spm_tokenizer() {
  static const SpmTokenizer tok(tiny_spm_vocabulary(), true);
  return tok;
}

const Tokenizer& tiny_bpe_tokenizer() {
  static const BpeTokenizer tok = [] {
    BpeParams p;
    p.pre = gguf_pretokenizer("gpt-2").pre;
    p.merges = tiny_bpe_merges();
    return BpeTokenizer(tiny_bpe_vocabulary(), std::move(p));
  }();
  return tok;
}

ModelConfig tiny_llama_config() {
  ModelConfig c;
  c.architecture = "llama";
  c.dim = 8;
  c.hidden_dim = 16;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.vocab_size = 16;
  c.max_seq_len = 32;
  c.rope_interleaved = false;
  c.fill_defaults();
  return c;
}

TensorView Weights::add(DType dtype, const Shape& shape) {
  Tensor f = Tensor::empty(DType::kF32, shape);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (int64_t i = 0; i < shape.numel(); ++i) f.data_as<float>()[i] = u(rng_);
  if (dtype == DType::kF32) {
    owned_.push_back(std::move(f));
  } else {
    Tensor t = Tensor::zeros(dtype, shape);  // q8_0 stays zero: the parsers never read values
    if (dtype != DType::kQ8_0) convert_n(f.data(), DType::kF32, t.data(), dtype, shape.numel());
    owned_.push_back(std::move(t));
  }
  return owned_.back().view();
}

void put_vocabulary(GgufWriter& w, const Vocabulary& v, const char* model) {
  w.set("tokenizer.ggml.model", GgufValue::str(model));
  w.set("tokenizer.ggml.tokens", GgufValue::str_array(v.tokens));
  w.set("tokenizer.ggml.scores", GgufValue::f32_array(v.scores));
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  w.set("tokenizer.ggml.token_type", GgufValue::i32_array(types));
  w.set("tokenizer.ggml.bos_token_id", GgufValue::u32(static_cast<uint32_t>(v.bos)));
  w.set("tokenizer.ggml.eos_token_id", GgufValue::u32(static_cast<uint32_t>(v.eos)));
  w.set("tokenizer.ggml.unknown_token_id", GgufValue::u32(static_cast<uint32_t>(v.unk)));
}

void put_llama_tensors(GgufWriter& w, Weights& ws, const ModelConfig& c, DType dtype) {
  const int64_t q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  w.add_tensor("token_embd.weight", ws.add(dtype, {c.vocab_size, c.dim}));
  w.add_tensor("output_norm.weight", ws.add(DType::kF32, {c.dim}));
  for (int64_t l = 0; l < c.n_layers; ++l) {
    w.add_tensor(layer_tensor(l, "attn_norm.weight"), ws.add(DType::kF32, {c.dim}));
    w.add_tensor(layer_tensor(l, "attn_q.weight"), ws.add(dtype, {q, c.dim}));
    w.add_tensor(layer_tensor(l, "attn_k.weight"), ws.add(dtype, {kv, c.dim}));
    w.add_tensor(layer_tensor(l, "attn_v.weight"), ws.add(dtype, {kv, c.dim}));
    w.add_tensor(layer_tensor(l, "attn_output.weight"), ws.add(dtype, {c.dim, q}));
    w.add_tensor(layer_tensor(l, "ffn_norm.weight"), ws.add(DType::kF32, {c.dim}));
    w.add_tensor(layer_tensor(l, "ffn_gate.weight"), ws.add(dtype, {c.hidden_dim, c.dim}));
    w.add_tensor(layer_tensor(l, "ffn_up.weight"), ws.add(dtype, {c.hidden_dim, c.dim}));
    w.add_tensor(layer_tensor(l, "ffn_down.weight"), ws.add(dtype, {c.dim, c.hidden_dim}));
  }
}

}  // namespace kvcache::fuzz
