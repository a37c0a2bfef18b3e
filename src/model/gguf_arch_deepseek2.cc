// GGUF architecture deepseek2: billed by `kvcache plan` (the MLA latent), not run yet.
// llama.cpp facts used here (src/llama-model.cpp load_hparams LLM_ARCH_DEEPSEEK2,
// convert_hf_to_gguf.py DeepseekV2Model.set_gguf_parameters):
//  - attention.kv_lora_rank, rope.dimension_count = qk_rope_head_dim;
//  - files written since llama.cpp's MLA rework store the compressed widths under
//    attention.key_length (kv_lora_rank + qk_rope) / value_length (kv_lora_rank) with
//    head_count_kv = 1, and the per-head widths under attention.key_length_mla
//    (qk_nope + qk_rope) / value_length_mla (v_head_dim); older files have no *_mla keys and
//    the per-head widths under key_length / value_length (read_decoder_layout's reading).
// Running them needs the tensor map (attn_kv_a_mqa, attn_kv_b or attn_k_b/attn_v_b, stacked
// ffn_*_exps, *_shexp, exp_probs_b) and the MoE keys (leading_dense_block_count, expert_count,
// expert_shared_count, expert_weights_scale/norm, expert_gating_func): refused until then.
#include "core/error.h"
#include "model/config_limits.h"
#include "model/decoder_layout.h"
#include "model/gguf.h"
#include "model/gguf_arch.h"

namespace kvcache {

namespace {

void read_layout(const GgufFile& g, DecoderLayout& d) {
  const std::string& path = g.path();
  if (d.kv_lora_rank <= 0) {
    throw Error(ErrorKind::kFormat,
                path + ": deepseek2 needs metadata 'deepseek2.attention.kv_lora_rank' > 0");
  }
  if (g.find("deepseek2.attention.key_length_mla") != nullptr) {
    const int64_t qk =
        check_config_count(path, "deepseek2.attention.key_length_mla",
                           g.get_int("deepseek2.attention.key_length_mla"), ConfigCount::kHeadDim);
    if (qk <= d.qk_rope_head_dim) {
      throw Error(ErrorKind::kFormat, path + ": deepseek2.attention.key_length_mla (" +
                                          std::to_string(qk) +
                                          ") must exceed rope.dimension_count");
    }
    d.head_dim = qk;
    d.qk_nope_head_dim = qk - d.qk_rope_head_dim;
    d.v_head_dim = check_config_count(path, "deepseek2.attention.value_length_mla",
                                      g.get_int_or("deepseek2.attention.value_length_mla", qk),
                                      ConfigCount::kHeadDim);
    d.n_kv_heads = d.n_heads;  // head_count_kv = 1 is the MQA form of the latent
  }
}

void read_config(const GgufFile& g, ModelFile&) {
  throw Error(ErrorKind::kUnsupported,
              g.path() +
                  ": GGUF architecture 'deepseek2' is billed by `kvcache plan` but not run yet; "
                  "run its Hugging Face folder (DeepseekV2ForCausalLM / DeepseekV3ForCausalLM)");
}

}  // namespace

KVCACHE_REGISTER_GGUF_ARCH(
    deepseek2,
    GgufArchitecture{
        "deepseek2", "deepseek_v2", &read_layout, &read_config, {}, nullptr, nullptr, nullptr});

}  // namespace kvcache
