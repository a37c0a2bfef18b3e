// The pieces a model is assembled from, and what they see of a forward call. A Model holds one
// Block per layer — an attention module and an MLP module, each owning its weights, plus the
// norms around them — and one Stack, which runs the blocks over the residual stream (the
// plain pre-norm stack, or a family's own, such as Gemma-3n's AltUp streams). Families
// (model/family.h) choose the modules; the forward loop (model/forward.h) never branches on
// the family. Modules are immutable after loading and shared by every Forward; what changes per
// call lives in the Step (geometry, cache, kernel, linear options) and its Workspace.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cache/cache.h"
#include "kernels/attention_kernel.h"
#include "kernels/rope.h"
#include "model/linear.h"
#include "model/workspace.h"

namespace kvcache {

// One forward call as the blocks see it. Activations are row-major over R = B * S rows (batch
// row b's tokens are rows [b*S, (b+1)*S)).
struct Step {
  int64_t B = 1, S = 1, R = 1;
  int64_t pos0 = 0;                   // absolute position of every batch row's first token ...
  const int64_t* row_pos0 = nullptr;  // ... unless each row has its own ([B], paged caches)
  // Which rows a layer's attention must produce: all; only the last row of each batch row (the
  // last layer when only next-token logits are wanted), written as rows 0..B-1; or none (the
  // last layer when the call only fills the cache: K/V enter the cache, nothing else).
  enum class Rows { kAll, kLast, kKvOnly } rows = Rows::kAll;
  Cache* cache = nullptr;  // never null: the forward's recompute container without one
  AttentionKernel* kernel = nullptr;
  LinearOptions linear;
  Workspace* ws = nullptr;

  int64_t row_pos(int64_t b) const { return row_pos0 != nullptr ? row_pos0[b] : pos0; }
  QueryPositions positions() const { return {pos0, row_pos0, 0}; }
};

// The forward's own buffers (model/forward.cc), which every block reads or writes:
//   0 x    [R, dim]                       the residual stream
//   1 xb   [R, max(dim, H*D_qk, H*D_v)]   a block's normed input, then its output
//   2 att  [R, max(H*D_qk, H*D_v, dim)]   attention output (free again once o_proj has run)
//   3 logits [R, vocab]
extern const ScratchKind kForwardScratch;
enum ForwardBuffer : size_t { kX, kXb, kAtt, kLogits };

class Attention {
 public:
  virtual ~Attention() = default;
  // Layer `layer` on the normed input in xb: one cache call (the layer's K/V in, the span it
  // attends out), one attention call, the output projection into xb. Returns the rows of xb it
  // wrote: R, or B for Rows::kLast when it attended the last rows only (0 for kKvOnly). A
  // module may ignore kLast and kKvOnly and produce every row.
  virtual int64_t forward(Step& st, int64_t layer) const = 0;
  // The layer whose keys and values this layer attends (itself unless KV-shared).
  virtual int64_t kv_source() const = 0;
};

class Mlp {
 public:
  virtual ~Mlp() = default;
  // The first `rows` rows of xb (normed input) replaced by the MLP's output. rows < st.R: the
  // last layer's kept rows.
  virtual void forward(Step& st, int64_t rows) const = 0;
};

// A layer's rotary embedding: frequencies [rot_dim / 2] (kept by the model), the pair order and
// YaRN's attention factor (1 for every other rope type).
struct RopeTable {
  const float* inv_freq = nullptr;
  RopeStyle style = RopeStyle::kInterleaved;
  float attention_factor = 1.0f;
  // rope_apply's parameters for n_tokens tokens whose heads rotate their first rot_dim dims.
  RopeParams params(int64_t n_tokens, int64_t rot_dim) const {
    RopeParams p;
    p.n_tokens = n_tokens;
    p.inv_freq = inv_freq;
    p.rot_dim = rot_dim;
    p.style = style;
    p.attention_factor = attention_factor;
    return p;
  }
};

// RMSNorm weights around a block ([dim] each, f32; Gemma's (1 + w) already added).
struct BlockNorms {
  const float* attn = nullptr;       // before attention
  const float* post_attn = nullptr;  // on the attention output (sandwich norms), or null
  const float* ffn = nullptr;        // before the MLP
  const float* post_ffn = nullptr;   // on the MLP output (sandwich norms), or null
};

struct Block {
  std::unique_ptr<Attention> attention;
  std::unique_ptr<Mlp> mlp;
  BlockNorms norms;
};

class Stack {
 public:
  virtual ~Stack() = default;
  // Runs every block on x (the embedded tokens of st's R rows) and leaves in x what the final
  // norm reads. Returns the rows of x that hold it: R, or B when the last layer ran only for
  // the last row of each batch row (logits kLast, moved to rows 0..B-1). `keep_last` says the
  // caller wants only those rows (or, with kv_only, none: the last layer may stop after its
  // cache update).
  virtual int64_t run(Step& st, const std::vector<Block>& blocks, const int32_t* tokens,
                      bool keep_last, bool kv_only) const = 0;
};

// Row helpers shared by the blocks.
inline void add_inplace(float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}
// Rows of B blocks of S (width floats each): row S - 1 of block b, the last position of batch
// row b, moves to row b.
void keep_last_rows(float* rows, int64_t B, int64_t S, int64_t width);
// RMSNorm of `rows` rows of `dim` floats from x into y (may alias x), rows ld floats apart (0:
// dim).
void norm_rows(const float* x, float* y, int64_t rows, int64_t dim, float eps, const float* weight,
               int64_t ld = 0);

}  // namespace kvcache
