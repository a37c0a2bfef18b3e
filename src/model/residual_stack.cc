#include "model/residual_stack.h"

namespace kvcache {

int64_t ResidualStack::run(Step& st, const std::vector<Block>& blocks, const int32_t*,
                           bool keep_last, bool kv_only) const {
  const int64_t B = st.B, S = st.S, R = st.R, L = static_cast<int64_t>(blocks.size());
  const ModelConfig& c = st.ws->config();
  const int64_t dim = c.dim;
  float* x = st.ws->data(kForwardScratch, kX);
  float* xb = st.ws->data(kForwardScratch, kXb);
  const bool last_rows_only = keep_last && R > B && L > 0;
  for (int64_t l = 0; l < L; ++l) {
    const Block& block = blocks[static_cast<size_t>(l)];
    const bool last = last_rows_only && l == L - 1;
    st.rows = !last ? Step::Rows::kAll : kv_only ? Step::Rows::kKvOnly : Step::Rows::kLast;
    norm_rows(x, xb, R, dim, c.rms_eps, block.norms.attn);
    const int64_t attended = block.attention->forward(st, l);
    if (last && kv_only) break;
    const int64_t rows = last ? B : R;
    if (last) {
      keep_last_rows(x, B, S, dim);
      if (attended == R) keep_last_rows(xb, B, S, dim);
    }
    if (block.norms.post_attn) norm_rows(xb, xb, rows, dim, c.rms_eps, block.norms.post_attn);
    add_inplace(x, xb, rows * dim);
    norm_rows(x, xb, rows, dim, c.rms_eps, block.norms.ffn);
    block.mlp->forward(st, rows);
    if (block.norms.post_ffn) norm_rows(xb, xb, rows, dim, c.rms_eps, block.norms.post_ffn);
    add_inplace(x, xb, rows * dim);
  }
  st.rows = Step::Rows::kAll;
  return last_rows_only ? B : R;
}

}  // namespace kvcache
