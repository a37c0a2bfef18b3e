// The pre-norm residual stack most decoders use (Llama, Mistral, Qwen2, Gemma-2, GPT-OSS,
// DeepSeek): per layer
//   x += [post_attn_norm](attention(attn_norm(x)))
//   x += [post_ffn_norm](mlp(ffn_norm(x)))
// with Gemma-2's sandwich norms where the block has them.
//
// The last layer of a call that wants only next-token logits runs for the kept rows only
// (llama.cpp's inp_out_ids): every row's K/V enters the cache, then the last row of each batch
// row goes on as row b (from the attention on where the attention module attends the last
// rows only, else from its output on); a call that only fills the cache stops after the last
// layer's cache update. The kept rows take the kernels the whole chunk would have taken
// (LinearOptions::as_rows, and a decode row of the attention kernels equals its prefill row),
// so their bits do not change; a 512-token chunk of llama-125m skips ~6% of its work.
#pragma once

#include "model/block.h"

namespace kvcache {

class ResidualStack final : public Stack {
 public:
  int64_t run(Step& st, const std::vector<Block>& blocks, const int32_t* tokens, bool keep_last,
              bool kv_only) const override;
};

}  // namespace kvcache
