// The one reader from a model's config (Hugging Face config.json, or GGUF metadata) to what its
// KV cache must hold: the family, per-layer types, windows, chunk sizes, head counts and dims,
// MLA's latent dims, cross-layer sharing, compression rates and linear-attention state dims.
// The runtime (parse_hf_config, the GGUF loader), the KV planner (`kvcache plan`) and, through
// the runtime's ModelConfig, the paged planner and the server all derive the cache's shape here,
// so they cannot disagree on it.
//
// Layer types follow transformers v5: an explicit `layer_types` wins; otherwise each family's
// configuration_*.py derives them (Qwen2's max_window_layers, Gemma-2's and GPT-OSS's
// alternation, Gemma-3's sliding_window_pattern, Gemma-3n's every fifth layer, Qwen3-Next's
// full_attention_interval, Llama-4's no_rope_layers), and any other family gets the generic
// rule of cache_utils.get_layer_types_and_kwargs: every layer sliding when sliding_window is
// set, else every layer chunked when attention_chunk_size is set, else full attention.
// What cannot be interpreted is an error naming the key: a layer type nobody defines, a sliding
// layer without a window, a chunked layer without a chunk size. Nothing falls back silently.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace kvcache {

class GgufFile;

struct DecoderLayout {
  // transformers' model_type of the decoder ("llama", "gemma2", "qwen3_next", ...), resolved
  // from architectures[0] first (as the runtime picks its family), then model_type.
  std::string family;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;     // the family's default when the config has none (Gemma 256, GPT-OSS 64)
  int64_t hidden_size = 0;  // 0: absent
  int64_t max_position_embeddings = 0;  // 0: absent
  // One per layer; the last num_kv_shared_layers read an earlier layer's cache.
  std::vector<std::string> layer_types;
  int64_t sliding_window = 0;        // 0 unless a layer slides
  int64_t attention_chunk_size = 0;  // 0 unless a layer is chunked
  int64_t num_kv_shared_layers = 0;
  // MLA (DeepSeek-V2/V3): kv_lora_rank > 0.
  int64_t kv_lora_rank = 0, qk_rope_head_dim = 0, qk_nope_head_dim = 0, v_head_dim = 0;
  // Compressed layer types (CSA/HCA) -> tokens per stored entry.
  std::map<std::string, int64_t> compress_rates;
  // DeepSeek-V4's lightning indexer (compressed_sparse_attention layers): the width c^I of its
  // compressed keys, one per entry (config index_head_dim, 128 by default as in
  // configuration_deepseek_v4.py); 0 when no layer has an indexer.
  int64_t index_head_dim = 0;
  // Linear attention (Gated DeltaNet) state: H_v·d_k·d_v + (k−1)·d_qkv elements with
  // d_qkv = 2·H_k·d_k + H_v·d_v; 0 if the dims are not all given.
  int64_t linear_state_elems = 0;
  int64_t linear_heads_k = 0, linear_heads_v = 0, linear_head_dim_k = 0, linear_head_dim_v = 0,
          linear_conv_kernel = 0;
};

// The layer types transformers' cache knows (cache_utils' DYNAMIC_LAYER_TYPE_MAPPING), the
// compressed ones excepted (they are known when compress_rates names them).
const std::vector<std::string>& known_layer_types();

// The decoder's config inside a config.json: `text_config` when the model is multimodal
// (Gemma-3n's ...ForConditionalGeneration), else the root. Its bos/eos ids and model_type are
// taken from the root when it lacks them.
nlohmann::json decoder_config(const nlohmann::json& root);
// `config` is a decoder config (see decoder_config); `root` the whole file, for architectures.
// Throws Error(kFormat) naming `source` and the key.
DecoderLayout read_decoder_layout(const nlohmann::json& root, const nlohmann::json& config,
                                  const std::string& source);
// From GGUF metadata ({arch}.block_count, head counts, key_length, sliding_window, ...); the
// layer pattern is the architecture's (model/gguf_arch.h read_layout: gemma2 alternating,
// gemma3 five sliding then one full, gpt-oss alternating, phi3 every layer, ...), since
// llama.cpp's files carry no per-layer pattern.
DecoderLayout read_decoder_layout(const GgufFile& gguf);

// transformers' generic rule (see the header comment), also for configs built in code.
std::vector<std::string> generic_layer_types(int64_t n_layers, int64_t sliding_window,
                                             int64_t attention_chunk_size);

}  // namespace kvcache
