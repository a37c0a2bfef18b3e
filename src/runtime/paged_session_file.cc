// Session files of the server's paged store (runtime/session_file.h, save_paged_session): a
// finished request's full blocks out of the prefix cache into a file, and back into the prefix
// cache, so that a later request starting with those tokens computes none of them.
#include <algorithm>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "core/error.h"
#include "model/fingerprint.h"
#include "model/model.h"
#include "runtime/session_file.h"
#include "runtime/session_file_io.h"

namespace kvcache {

namespace {

constexpr const char* kImplementation = "paged";

// Layers that own pages; Error(kUnsupported) unless every attention layer keeps all its
// blocks in the prefix cache (full attention, no linear or compressed state).
std::vector<int> page_layers(const PagedKVStore& store) {
  const PagedStoreConfig& c = store.config();
  if (store.has_linear() || store.has_compressed())
    throw Error(ErrorKind::kUnsupported,
                "slot save/restore: this model keeps state outside its KV blocks (linear-attention "
                "or compressed layers); only full-attention models can be saved");
  std::vector<int> layers;
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    if (c.layer_types[l] != "full_attention")
      throw Error(ErrorKind::kUnsupported,
                  "slot save/restore: layer " + std::to_string(l) + " is " + c.layer_types[l] +
                      " (its old blocks leave the window); only full-attention models can be "
                      "saved");
    if (paged_layer_owns_pages(c, static_cast<int>(l))) layers.push_back(static_cast<int>(l));
  }
  return layers;
}

// A sequence of the store for the task's duration: the engine's batch comes back after it.
class TaskSequence {
 public:
  explicit TaskSequence(PagedKVStore& store)
      : store_(store), batch_(store.batch().begin(), store.batch().end()) {
    seq_ = store_.add_sequence();
    const SeqId b[1] = {seq_};
    store_.set_batch(b);
  }
  ~TaskSequence() {
    if (store_.step_open()) store_.abort_step();
    store_.free_sequence(seq_);  // keyed blocks stay in the prefix cache
    store_.set_batch(batch_);
  }
  SeqId id() const { return seq_; }

 private:
  PagedKVStore& store_;
  std::vector<SeqId> batch_;
  SeqId seq_ = -1;
};

}  // namespace

PagedSessionResult save_paged_session(PagedKVStore& store, const Model& model,
                                      std::span<const int32_t> tokens, const std::string& path) {
  const std::vector<int> layers = page_layers(store);
  if (store.step_open()) throw Error(ErrorKind::kInvalidArgument, "slot save during a step");
  if (store.quantized())  // the file holds f16/f32 page rows; packed pages have none
    throw Error(ErrorKind::kUnsupported,
                "slot save: the session file format holds unquantized page rows, but this "
                "server's pages are quantized (--kv-bits); use f16/f32 pages to save slots");
  const PagedStoreConfig& c = store.config();
  const int64_t bt = store.block_tokens();
  TaskSequence seq(store);
  const int64_t n = store.allocated() ? store.attach_prefix(seq.id(), tokens,
                                                            PagedKVStore::PrefixMatch::kFullBlocks)
                                      : 0;
  const int64_t blocks = n / bt;
  if (blocks == 0)
    throw Error(ErrorKind::kOutOfRange,
                "none of the sequence's " + std::to_string(tokens.size()) +
                    " tokens are in the prefix cache any more (evicted, or shorter than one "
                    "block of " +
                    std::to_string(bt) + ")");
  SessionFileWriter out(path);
  out.header(model_fingerprint(model), kImplementation, dtype_name(c.dtype), c.layer_types,
             tokens.first(static_cast<size_t>(blocks * bt)));
  out.u32(static_cast<uint32_t>(bt));
  for (int l : layers) {
    out.i64(l);
    const KVSpan span = store.peek_span(l);
    const PagedKV& p = span.paged;
    KV_CHECK(p.indptr[1] - p.indptr[0] >= blocks, "slot save: the block table is short");
    for (const TensorView* pages : {&p.k_pages, &p.v_pages})
      for (int64_t b = 0; b < blocks; ++b) {
        const int32_t id = p.indices[p.indptr[0] + b];
        out.view(pages->slice(0, id, id + 1));
      }
  }
  PagedSessionResult r;
  r.tokens = blocks * bt;
  r.bytes = out.commit();
  return r;
}

PagedSessionResult load_paged_session(PagedKVStore& store, const Model& model,
                                      const std::string& path) {
  const std::vector<int> layers = page_layers(store);
  if (store.step_open()) throw Error(ErrorKind::kInvalidArgument, "slot restore during a step");
  if (store.quantized())  // the file holds f16/f32 page rows; packed pages have none
    throw Error(ErrorKind::kUnsupported,
                "slot restore: the session file format holds unquantized page rows, but this "
                "server's pages are quantized (--kv-bits); use f16/f32 pages to save slots");
  const PagedStoreConfig& c = store.config();
  SessionFileReader in(path, /*verify=*/true);
  in.check_matches(model_fingerprint(model), kImplementation, dtype_name(c.dtype), c.layer_types);
  const std::vector<int32_t>& tokens = in.info().tokens;
  const auto fb = static_cast<int64_t>(in.u32());
  const auto n = static_cast<int64_t>(tokens.size());
  if (fb < 1 || n % fb != 0)
    throw Error(ErrorKind::kFormat, "session file " + path + ": " + std::to_string(n) +
                                        " tokens are not whole blocks of " + std::to_string(fb));
  const int64_t file_blocks = n / fb;
  const ModelConfig& mc = model.config();
  int64_t heads = c.kv_heads > 0 ? c.kv_heads : mc.n_kv_heads;
  int64_t dk = c.head_dim > 0 ? c.head_dim : mc.head_dim;
  int64_t dv = c.head_dim_v > 0 ? c.head_dim_v : dk;
  if (store.allocated() && !layers.empty()) {  // the pages' own shape
    const PagedKV p = store.peek_span(layers[0]).paged;
    heads = p.k_pages.dim(1);
    dk = p.k_pages.dim(3);
    dv = p.v_pages.dim(3);
  }

  TaskSequence seq(store);
  // Blocks still cached are reused; the rest of the tokens are written as one step. The last
  // token's block is written too: attach_prefix never takes the last token.
  const int64_t have =
      store.allocated()
          ? store.attach_prefix(seq.id(), tokens, PagedKVStore::PrefixMatch::kFullBlocks)
          : 0;
  PagedSessionResult r;
  r.tokens = n;
  r.bytes = in.info().file_bytes;
  if (have >= n) return r;
  const int64_t todo = n - have;
  if (store.plan_step(todo, std::span<const int32_t>(tokens).subspan(static_cast<size_t>(have))) ==
      StepStatus::kOutOfBlocks)
    throw Error(ErrorKind::kOutOfRange, "not enough free KV blocks to restore " +
                                            std::to_string(todo) +
                                            " tokens; retry when the "
                                            "server is less busy");
  const size_t kpage = dtype_bytes(c.dtype, heads * fb * dk);
  const size_t vpage = dtype_bytes(c.dtype, heads * fb * dv);
  Tensor k = Tensor::empty(c.dtype, {1, heads, todo, dk});
  Tensor v = Tensor::empty(c.dtype, {1, heads, todo, dv});
  // The blocks this restore fills are keyed when the last layer's write closes the step.
  store.set_commit_source(BlockSource::kSession);
  struct ResetSource {
    PagedKVStore& s;
    ~ResetSource() { s.set_commit_source(BlockSource::kComputed); }
  } reset_source{store};
  for (int l : layers) {
    const int64_t layer = in.i64();
    if (layer != l)
      throw Error(ErrorKind::kFormat, "session file " + path + ": layer " + std::to_string(layer) +
                                          " where layer " + std::to_string(l) + " was expected");
    for (int part = 0; part < 2; ++part) {
      Tensor& dst = part == 0 ? k : v;
      const int64_t d = part == 0 ? dk : dv;
      const size_t page = part == 0 ? kpage : vpage;
      for (int64_t b = 0; b < file_blocks; ++b) {
        const uint8_t* src = in.take(page);
        const int64_t from = b * fb, to = from + fb;  // tokens of this block
        if (to <= have) continue;
        const int64_t lo = std::max(from, have);
        TensorView block(const_cast<uint8_t*>(src), c.dtype, {1, heads, fb, d});
        copy_view(block.slice(2, lo - from, fb), dst.view().slice(2, lo - have, to - have));
      }
    }
    store.write(l, k.view(), v.view());
  }
  in.expect_end();
  return r;
}

}  // namespace kvcache
