// T5 (transformers' T5ForConditionalGeneration, src/transformers/models/t5/modeling_t5.py): an
// encoder-decoder. The encoder runs once over the input ids; every decoder layer projects its
// output into cross-attention keys and values once (EncoderDecoderCache::set_cross); the
// decoder then generates token by token from decoder_start_token_id through a self-attention
// Cache (any container: dynamic, static, paged).
//
// What T5 does differently from the decoder-only families (and why it has its own runner
// instead of the shared Forward, model/forward.h, whose Model/Stack carry one token stream and
// one cache call per layer, with no second input):
//   - no position embeddings or RoPE: a learned bias per (relative-position bucket, head) is
//     added to the attention scores. Only the first layer of each stack owns the table
//     (relative_attention_bias); the bias it computes is shared by every layer. Buckets are
//     bidirectional in the encoder, unidirectional (keys at or before the query) in the decoder.
//   - scores are not scaled by 1/sqrt(d_kv) (Mesh TensorFlow folds it into the init of q).
//   - T5LayerNorm: RMS norm without mean subtraction or bias.
//   - feed-forward: relu (t5) or gated-gelu (t5 v1.1, flan-t5: gelu_new(wi_0 x) * wi_1 x).
//   - decoder blocks: self-attention, cross-attention over the encoder output, feed-forward.
//   - tie_word_embeddings: the lm head is the shared embedding and its input is scaled by
//     d_model^-0.5 first.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/encoder_decoder_cache.h"
#include "core/tensor.h"
#include "model/linear.h"

namespace kvcache {

class SafetensorsFile;

enum class T5Activation { kRelu, kGeluTanh, kGeluErf };

// The fields of a transformers T5Config (config.json) the forward reads.
struct T5Config {
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t d_kv = 0;
  int64_t d_ff = 0;
  int64_t num_heads = 0;
  int64_t num_layers = 0;          // encoder
  int64_t num_decoder_layers = 0;  // decoder (config default: num_layers)
  int64_t relative_attention_num_buckets = 32;
  int64_t relative_attention_max_distance = 128;
  float layer_norm_epsilon = 1e-6f;
  bool gated = false;  // feed_forward_proj "gated-*"
  T5Activation act = T5Activation::kRelu;
  bool tie_word_embeddings = true;
  int32_t decoder_start_token_id = 0;
  int32_t eos_token_id = 1;
  int64_t max_decoder_len = 512;  // n_positions when given: generate's context bound
  int64_t inner() const { return num_heads * d_kv; }
  std::string summary() const;
};

// Parses config.json text; Error(kFormat) "<source>: ..." for a missing or invalid field or an
// unsupported feed_forward_proj.
T5Config parse_t5_config(const std::string& json_text, const std::string& source);
// Whether a config.json text describes an encoder-decoder model (is_encoder_decoder true, or
// model_type t5 / mt5 / umt5 / longt5).
bool config_is_encoder_decoder(const std::string& json_text);
// Whether `spec` (a --model value) is an encoder-decoder model: "dummy:t5-*", or a folder (or a
// .safetensors file) whose config.json says so. Reads only config.json.
bool is_encoder_decoder_model(const std::string& spec);

// T5's relative-position bucket of (key position - query position), computed in float as
// modeling_t5.py's _relative_position_bucket does in torch.float32 (the log-spaced buckets'
// boundaries depend on it).
int64_t t5_relative_position_bucket(int64_t relative_position, bool bidirectional,
                                    int64_t num_buckets, int64_t max_distance);

class T5Model {
 public:
  // A Hugging Face folder: config.json + model.safetensors with transformers' tensor names
  // (shared.weight, encoder.block.N.layer.0.SelfAttention.q.weight, ...,
  // decoder.block.N.layer.1.EncDecAttention.k.weight, ..., lm_head.weight when untied).
  // Error(kFormat) naming the file and the tensor for a missing tensor or a wrong shape.
  static std::unique_ptr<T5Model> load(const std::string& folder);

  const T5Config& config() const { return config_; }
  size_t weight_bytes() const;

  struct Attn {
    TensorView q, k, v, o;  // q, k, v [inner, d_model]; o [d_model, inner]
  };
  struct FF {
    TensorView wi, wi_0, wi_1, wo;  // wi (relu) or wi_0 / wi_1 (gated) [d_ff, d_model]
  };
  struct EncoderLayer {
    std::vector<float> ln_self, ln_ff;
    Attn self;
    FF ff;
  };
  struct DecoderLayer {
    std::vector<float> ln_self, ln_cross, ln_ff;
    Attn self, cross;
    FF ff;
  };
  const std::vector<EncoderLayer>& encoder() const { return encoder_; }
  const std::vector<DecoderLayer>& decoder() const { return decoder_; }
  const TensorView& shared() const { return shared_; }                      // [vocab, d_model]
  const TensorView& lm_head() const { return lm_head_; }                    // shared when tied
  const std::vector<float>& encoder_bias() const { return encoder_bias_; }  // [buckets, H]
  const std::vector<float>& decoder_bias() const { return decoder_bias_; }  // [buckets, H]
  const std::vector<float>& encoder_final_norm() const { return encoder_final_; }
  const std::vector<float>& decoder_final_norm() const { return decoder_final_; }

 private:
  T5Config config_;
  std::shared_ptr<const SafetensorsFile> file_;
  TensorView shared_, lm_head_;
  std::vector<float> encoder_bias_, decoder_bias_, encoder_final_, decoder_final_;
  std::vector<EncoderLayer> encoder_;
  std::vector<DecoderLayer> decoder_;
};

// The decoder's self-attention cache config: one full_attention layer per decoder layer.
CacheConfig t5_cache_config(const T5Config& config, CacheOptions options);

// Runs a T5Model: the encoder once per input, then decoder chunks. Holds its scratch; not
// thread-safe. The cache is the caller's.
class T5Runner {
 public:
  explicit T5Runner(const T5Model& model) : model_(model) {}

  // Runs the encoder on ids [B, S_enc] and stores every decoder layer's cross K/V in `cache`
  // (Error when the cache already holds them: reset() it first). Error(kInvalidArgument) for
  // ids outside the vocabulary or an empty input.
  void encode(const int32_t* ids, int64_t batch, int64_t n_tokens, EncoderDecoderCache& cache);

  // Decoder tokens [B, S] at positions pos0.. (the self cache must hold exactly pos0 tokens per
  // row): the logits of the last position of each row ([B, vocab]) or of every position
  // ([B, S, vocab]); valid until the next call.
  std::span<const float> decode(const int32_t* tokens, int64_t batch, int64_t n_tokens,
                                int64_t pos0, EncoderDecoderCache& cache, bool all_logits);

  // The encoder's final hidden states of the last encode() ([B * S_enc, d_model]).
  const std::vector<float>& encoder_output() const { return enc_out_; }

 private:
  static void add_rows(float* x, const float* y, int64_t n);
  // x += FF(norm(x)) over R rows.
  void feed_forward(const T5Model::FF& ff, const float* ln, int64_t R);

  const T5Model& model_;
  LinearOptions lin_;
  std::vector<float> enc_out_;
  std::vector<float> x_, xb_, q_, k_, v_, att_, h0_, h1_, logits_, kbuf_, vbuf_, scores_;
};

// Writes (or reuses) the dummy T5 folder of a preset ("t5-tiny": relu, tied; "t5-tiny-gated":
// gated-gelu, untied) with seeded random f32 weights under cache_dir (empty: the user's model
// cache folder). Returns the folder.
std::string build_dummy_t5(const std::string& preset, uint64_t seed, const std::string& cache_dir);
std::vector<std::string> dummy_t5_preset_names();
// The preset's config.json text (Error naming the presets for another name).
std::string dummy_t5_config_json(const std::string& preset);

}  // namespace kvcache
