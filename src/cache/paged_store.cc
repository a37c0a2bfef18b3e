#include "cache/paged_store.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>
#include <tuple>

#include "cache/block_record.h"
#include "cache/crop_rule.h"
#include "core/digest.h"
#include "core/error.h"
#include "core/fault.h"

namespace kvcache {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

[[noreturn]] void bad(const std::string& msg, ErrorKind kind = ErrorKind::kInvalidArgument) {
  throw Error(kind, "paged cache: " + msg);
}

}  // namespace

bool is_compressed_layer_type(const std::string& type) {
  return type == "compressed_sparse_attention" || type == "heavily_compressed_attention";
}

std::vector<PagedGroup> paged_groups(const std::vector<std::string>& layer_types,
                                     int64_t sliding_window,
                                     const std::map<std::string, int64_t>& compress_rates) {
  std::vector<PagedGroup> groups;
  int full = -1, sliding = -1;
  std::map<int64_t, int> by_rate;  // compressed group of each rate
  for (size_t l = 0; l < layer_types.size(); ++l) {
    const std::string& t = layer_types[l];
    int* slot = nullptr;
    PagedGroup proto;
    if (t == "linear_attention") continue;  // state per sequence, no blocks (see the header)
    if (t == "full_attention" || is_indexed_layer_type(t)) {
      slot = &full;
    } else if (t == "sliding_attention" || is_compressed_layer_type(t)) {
      if (sliding_window <= 0)
        bad("layer " + std::to_string(l) + " is " + t + " (a sliding window) but the window is " +
            std::to_string(sliding_window) + "; set a positive window");
      slot = &sliding;
      proto.kind = GroupKind::kSliding;
      proto.window = sliding_window;
    } else {
      bad("layer " + std::to_string(l) + " has type '" + t +
              "'; the paged cache serves full_attention, sliding_attention, linear_attention, "
              "compressed_sparse_attention, heavily_compressed_attention and "
              "deepseek_sparse_attention layers (use the dynamic or static cache for this model)",
          ErrorKind::kUnsupported);
    }
    if (*slot < 0) {
      *slot = static_cast<int>(groups.size());
      groups.push_back(proto);
    }
    groups[static_cast<size_t>(*slot)].layers.push_back(static_cast<int>(l));
    if (is_compressed_layer_type(t)) {
      const auto it = compress_rates.find(t);
      if (it == compress_rates.end() || it->second < 1)
        bad("layer " + std::to_string(l) + " is " + t +
            " but the store has no compress rate for it; set PagedStoreConfig::compressed from "
            "the model's cache config (compress_rates)");
      int& cg = by_rate.try_emplace(it->second, -1).first->second;
      if (cg < 0) {
        cg = static_cast<int>(groups.size());
        groups.push_back({.kind = GroupKind::kCompressed, .rate = it->second, .layers = {}});
      }
      groups[static_cast<size_t>(cg)].layers.push_back(static_cast<int>(l));
    }
  }
  return groups;
}

std::vector<int32_t> default_group_blocks(const PagedStoreConfig& c) {
  std::vector<int32_t> blocks;
  const int64_t full = std::max<int64_t>(1, ceil_div(c.max_tokens, c.block_tokens));
  for (const PagedGroup& g : paged_groups(c.layer_types, c.sliding_window, c.compressed.rates)) {
    if (g.kind == GroupKind::kCompressed)  // entries; each sequence may leave one block partial
      blocks.push_back(static_cast<int32_t>(ceil_div(c.max_tokens, g.rate * c.block_tokens) +
                                            std::max<int32_t>(1, c.linear_slots)));
    else
      blocks.push_back(static_cast<int32_t>(
          g.kind == GroupKind::kSliding || (g.kind == GroupKind::kFull && c.streaming) ? full + 1
                                                                                       : full));
  }
  return blocks;
}

bool paged_layer_k_only(const PagedStoreConfig& c, int layer) {
  return c.shared_kv || is_compressed_layer_type(c.layer_types[static_cast<size_t>(layer)]);
}

namespace {

// A compressor stream's state: buffered rows (< rate) of kv and gate, and (CSA) the overlap's Ca
// half [rate, width / 2] of kv and gate.
int64_t stream_state_elems(int64_t rate, int64_t width, bool overlap) {
  return 2 * (rate - 1) * width + (overlap ? 2 * rate * (width / 2) : 0);
}

bool is_csa(const std::string& type) {
  return type == "compressed_sparse_attention";
}

int64_t stream_width(const PagedStoreConfig& c, const std::string& type, CompressedStream s) {
  if (s == CompressedStream::kIndexer) return 2 * c.compressed.index_head_dim;
  return is_csa(type) ? 2 * c.head_dim : c.head_dim;
}

int64_t layer_rate(const PagedStoreConfig& c, const std::string& type) {
  const auto it = c.compressed.rates.find(type);
  return it == c.compressed.rates.end() ? 0 : it->second;
}

int64_t layer_compressor_elems(const PagedStoreConfig& c, const std::string& type) {
  if (!is_compressed_layer_type(type)) return 0;
  const int64_t r = layer_rate(c, type);
  int64_t n =
      stream_state_elems(r, stream_width(c, type, CompressedStream::kCompressor), is_csa(type));
  if (is_csa(type))
    n += stream_state_elems(r, stream_width(c, type, CompressedStream::kIndexer), true);
  return n;
}

}  // namespace

int64_t paged_compressor_state_elems(const PagedStoreConfig& c) {
  int64_t n = 0;
  for (const std::string& t : c.layer_types) n += layer_compressor_elems(c, t);
  return n;
}

bool paged_layer_owns_pages(const PagedStoreConfig& c, int layer) {
  return layer < static_cast<int>(c.layer_types.size()) - c.num_kv_shared_layers;
}

size_t paged_block_bytes(const PagedStoreConfig& c, const PagedGroup& g) {
  const int64_t dv = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  if (c.quant) {  // packed: one K and one V block per (block, head) of every page-owning layer
    if (c.kv_heads < 1 || c.head_dim < 1) return 0;
    const KVBlockFormat f = paged_quant_format(c);
    size_t layers = 0;
    for (const int l : g.layers) layers += paged_layer_owns_pages(c, l) ? 1 : 0;
    return layers * static_cast<size_t>(c.kv_heads) *
           static_cast<size_t>(kv_k_block_bytes(f) + kv_v_block_bytes(f));
  }
  const auto bt = static_cast<size_t>(c.block_tokens);
  const size_t index_row = dtype_bytes(c.dtype, c.compressed.index_head_dim);
  size_t total = 0;
  for (const int l : g.layers) {
    if (!paged_layer_owns_pages(c, l)) continue;
    const std::string& t = c.layer_types[static_cast<size_t>(l)];
    if (g.kind == GroupKind::kCompressed) {  // one-head entries, and CSA's indexer keys
      total += bt * (dtype_bytes(c.dtype, c.head_dim) + (is_csa(t) ? index_row : 0));
      continue;
    }
    total += static_cast<size_t>(c.kv_heads) * bt *
             (dtype_bytes(c.dtype, c.head_dim) +
              (paged_layer_k_only(c, l) ? 0 : dtype_bytes(c.dtype, dv)));
    if (is_indexed_layer_type(t)) total += bt * index_row;  // DSA: one indexer key per token
  }
  return total;
}

size_t predict_pool_bytes(const PagedStoreConfig& c) {
  const std::vector<PagedGroup> groups =
      paged_groups(c.layer_types, c.sliding_window, c.compressed.rates);
  const std::vector<int32_t> blocks =
      c.group_blocks.empty() ? default_group_blocks(c) : c.group_blocks;
  size_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    total += static_cast<size_t>(blocks[g]) * paged_block_bytes(c, groups[g]);
    total += BlockPool::predict_bytes({.num_blocks = blocks[g],
                                       .block_tokens = c.block_tokens,
                                       .group = static_cast<int32_t>(g)});
  }
  return total;
}

std::vector<int> paged_linear_layers(const PagedStoreConfig& c) {
  std::vector<int> out;
  for (size_t l = 0; l < c.layer_types.size(); ++l)
    if (c.layer_types[l] == "linear_attention") out.push_back(static_cast<int>(l));
  return out;
}

namespace {
LinearSlotLayout linear_layout(const PagedStoreConfig& c) {
  return {.shape = c.linear,
          .n_layers = static_cast<int>(paged_linear_layers(c).size()),
          .extra_elems = paged_compressor_state_elems(c)};
}
bool has_state(const PagedStoreConfig& c) {
  return !paged_linear_layers(c).empty() || paged_compressor_state_elems(c) > 0;
}
int32_t linear_slot_count(const PagedStoreConfig& c) {
  return std::max<int32_t>(1, c.linear_slots);
}
}  // namespace

size_t paged_linear_bytes_per_sequence(const PagedStoreConfig& c) {
  return has_state(c) ? linear_layout(c).slot_bytes() : 0;
}

size_t predict_linear_state_bytes(const PagedStoreConfig& c) {
  if (!has_state(c)) return 0;
  const LinearSlotLayout l = linear_layout(c);
  const auto n = static_cast<size_t>(paged_linear_layers(c).empty() ? 0 : linear_slot_count(c));
  // Workspaces: `previous` and the gathered windows, and the gathered recurrent states.
  const size_t ws = n * static_cast<size_t>(2 * l.conv_elems() + l.rec_elems()) * sizeof(float);
  return LinearStateSlots::predict_bytes(l, linear_slot_count(c)) + ws;
}

size_t predict_snapshot_bytes(const PagedStoreConfig& c) {
  if (paged_linear_layers(c).empty()) return 0;
  return LinearSnapshotStore::predict_bytes(linear_layout(c).slot_elems(), c.max_snapshots);
}

void check_paged_quant(const PagedStoreConfig& c) {
  if (!c.quant) return;
  const auto refuse = [](const std::string& why) {
    throw Error(ErrorKind::kUnsupported, "paged cache: quantized pages (--kv-bits / --kv-quant) " +
                                             why + "; serve this model with f16/f32 pages");
  };
  if (c.shared_kv)
    refuse(
        "cannot hold this model's K == V layers: the packed format quantizes keys per channel "
        "and values per token, so one stored copy cannot serve as both");
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    const std::string& t = c.layer_types[l];
    if (t == "linear_attention" || is_compressed_layer_type(t) || is_indexed_layer_type(t))
      refuse("are defined for full and sliding attention layers only, but layer " +
             std::to_string(l) + " is " + t +
             " (its state, compressed entries or indexer keys have no quantized format)");
  }
}

KVBlockFormat paged_quant_format(const PagedStoreConfig& c) {
  KV_CHECK(c.quant.has_value(), "paged_quant_format of an unquantized store");
  const int64_t dv = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  try {
    return make_kv_block_format(c.quant->scheme, c.quant->bits, c.block_tokens, c.head_dim, dv);
  } catch (const Error& e) {
    throw Error(ErrorKind::kInvalidArgument, std::string("paged cache: quantized pages of ") +
                                                 std::to_string(c.block_tokens) +
                                                 "-token blocks: " + e.what());
  }
}

int32_t paged_sequence_slots(const PagedStoreConfig& c) {
  return std::max<int32_t>(1, c.linear_slots);
}

int64_t paged_quant_step_tokens(const PagedStoreConfig& c) {
  if (c.max_step_tokens > 0) return c.max_step_tokens;
  const std::vector<int32_t> blocks =
      c.group_blocks.empty() ? default_group_blocks(c) : c.group_blocks;
  return static_cast<int64_t>(blocks.empty() ? 0 : blocks[0]) * c.block_tokens;
}

namespace {
// Tokens of one layer's step workspace: every row may bring a tail of up to G - 1 tokens.
int64_t quant_workspace_tokens(const PagedStoreConfig& c) {
  return static_cast<int64_t>(paged_sequence_slots(c)) * (c.block_tokens - 1) +
         paged_quant_step_tokens(c);
}
}  // namespace

size_t predict_quant_state_bytes(const PagedStoreConfig& c) {
  if (!c.quant || c.kv_heads < 1 || c.head_dim < 1) return 0;
  const int64_t dv = c.head_dim_v > 0 ? c.head_dim_v : c.head_dim;
  const int64_t rows =
      static_cast<int64_t>(paged_sequence_slots(c)) * c.block_tokens + quant_workspace_tokens(c);
  size_t layers = 0;
  for (size_t l = 0; l < c.layer_types.size(); ++l)
    layers += paged_layer_owns_pages(c, static_cast<int>(l)) ? 1 : 0;
  return layers * dtype_bytes(c.dtype, rows * c.kv_heads * (c.head_dim + dv)) +
         static_cast<size_t>(c.block_tokens * std::max(c.head_dim, dv)) * sizeof(float);
}

Tensor gather_paged(const PagedKV& kv, bool values) {
  const TensorView& pages = values ? kv.v_pages : kv.k_pages;
  int64_t S = 0;
  for (int64_t b = 0; b < kv.batch; ++b) S = std::max(S, kv.seq_len(b));
  const int64_t H = pages.dim(1), D = pages.dim(3);
  Tensor out = Tensor::zeros(pages.dtype(), {kv.batch, H, S, D});
  const TensorView o = out.view();
  const size_t row = dtype_bytes(pages.dtype(), D);
  for (int64_t b = 0; b < kv.batch; ++b)
    for (int64_t j = 0; j < kv.seq_len(b); ++j) {
      const int32_t page = kv.indices[kv.indptr[b] + j / kv.block_tokens];
      for (int64_t h = 0; h < H; ++h)
        std::memcpy(o.ptr(b, h, j), pages.ptr(page, h, j % kv.block_tokens), row);
    }
  return out;
}

PagedKVStore::PagedKVStore(const PagedStoreConfig& config) : config_(config) {
  if (config_.block_tokens < 1)
    bad("--block-tokens must be >= 1, got " + std::to_string(config_.block_tokens));
  if (config_.num_kv_shared_layers < 0 ||
      config_.num_kv_shared_layers >= static_cast<int>(config_.layer_types.size()))
    bad("num_kv_shared_layers is " + std::to_string(config_.num_kv_shared_layers) + " for " +
        std::to_string(config_.layer_types.size()) +
        " layers; it must leave at least one layer that stores");
  if (!dtype_is_float(config_.dtype)) bad("pages store f32, f16 or bf16", ErrorKind::kUnsupported);
  check_paged_quant(config_);  // first: the reason a quantized store refuses the model
  if (config_.streaming && config_.quant)
    bad("a streaming --kv-policy with quantized pages: the residual slots and released packed "
        "blocks are not combined yet; pick one (drop --kv-bits/--kv-quant or use --kv-policy "
        "exact)",
        ErrorKind::kUnsupported);
  if (config_.streaming)
    for (size_t l = 0; l < config_.layer_types.size(); ++l) {
      const std::string& t = config_.layer_types[l];
      if (t == "linear_attention" || is_compressed_layer_type(t) || is_indexed_layer_type(t))
        bad("a streaming --kv-policy releases full-attention blocks between steps, but layer " +
                std::to_string(l) + " is " + t +
                ", whose state or compressed entries depend on every token the policy would "
                "drop; serve this model with --kv-policy exact",
            ErrorKind::kUnsupported);
    }
  groups_ = paged_groups(config_.layer_types, config_.sliding_window, config_.compressed.rates);
  if (groups_.empty())
    bad("no attention layers: the paged cache pages K/V blocks and keys its prefix cache by "
        "them; a model without full or sliding attention layers has nothing to page (use the "
        "dynamic or static cache)",
        ErrorKind::kUnsupported);
  if (config_.group_blocks.empty()) {
    if (config_.max_tokens <= 0) bad("needs a block count per group or max_tokens");
    config_.group_blocks = default_group_blocks(config_);
  }
  if (config_.group_blocks.size() != groups_.size())
    bad(std::to_string(config_.group_blocks.size()) + " block counts for " +
        std::to_string(groups_.size()) + " layer groups");
  const size_t n_layers = config_.layer_types.size();
  layer_group_.assign(n_layers, 0);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const int32_t nb = config_.group_blocks[g];
    if (has_null_block(static_cast<int>(g)) && nb < 2)
      bad(std::string(groups_[g].kind == GroupKind::kSliding
                          ? "a sliding group"
                          : "a full group of a streaming store") +
          " needs at least 2 blocks (one is the null block)");
    pools_.push_back(std::make_unique<BlockPool>(BlockPoolConfig{
        .num_blocks = nb, .block_tokens = config_.block_tokens, .group = static_cast<int32_t>(g)}));
    if (has_null_block(static_cast<int>(g))) {
      std::vector<int32_t> null_block;
      KV_CHECK(pools_[g]->allocate(1, null_block) && null_block[0] == 0,
               "null block must be block 0");
    }
    if (groups_[g].kind == GroupKind::kCompressed) continue;  // layer_cgroup_ below
    for (const int l : groups_[g].layers)
      layer_group_[static_cast<size_t>(l)] = static_cast<int>(g);
  }
  layer_cgroup_.assign(n_layers, -1);
  cstate_offset_.assign(n_layers, -1);
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].kind == GroupKind::kCompressed)
      for (const int l : groups_[g].layers)
        layer_cgroup_[static_cast<size_t>(l)] = static_cast<int>(g);
  for (size_t l = 0; l < n_layers; ++l) {
    const std::string& t = config_.layer_types[l];
    if (!is_compressed_layer_type(t) && !is_indexed_layer_type(t)) continue;
    if (is_compressed_layer_type(t)) compressed_layers_.push_back(static_cast<int>(l));
    if (!paged_layer_owns_pages(config_, static_cast<int>(l)))
      bad("layer " + std::to_string(l) + " (" + t +
              ") is KV-shared; the paged cache does not "
              "share compressed or indexed layers",
          ErrorKind::kUnsupported);
    if ((is_csa(t) || is_indexed_layer_type(t)) && config_.compressed.index_head_dim < 1)
      bad("layer " + std::to_string(l) + " is " + t + " but the store's index_head_dim is " +
          std::to_string(config_.compressed.index_head_dim) +
          "; set PagedStoreConfig::compressed from the model's cache config");
  }
  if (!compressed_layers_.empty() && (config_.kv_heads != 1 || config_.head_dim < 1))
    bad("compressed layers need kv_heads 1 (K==V, one head) and head_dim known up front (the "
        "compressor state's widths follow it); got kv_heads " +
        std::to_string(config_.kv_heads) + ", head_dim " + std::to_string(config_.head_dim));
  if (config_.quant) {
    kq_.resize(n_layers);
    vq_.resize(n_layers);
    rk_.resize(n_layers);
    rv_.resize(n_layers);
    wk_.resize(n_layers);
    wv_.resize(n_layers);
    qrows_.resize(n_layers);
    qoff_.resize(n_layers);
    for (int32_t i = paged_sequence_slots(config_) - 1; i >= 0; --i) qfree_.push_back(i);
  }
  k_pages_.resize(n_layers);
  v_pages_.resize(n_layers);
  c_pages_.resize(n_layers);
  x_pages_.resize(n_layers);
  x_written_.assign(n_layers, 0);
  kv_written_.assign(n_layers, 0);
  step_parts_.assign(n_layers, 0);
  streams_.resize(n_layers * 2);
  step_wrote_.assign(n_layers, 0);
  attached_.assign(n_layers, 0);
  indptr_.resize(groups_.size());
  indices_.resize(groups_.size());
  last_len_.resize(groups_.size());
  row_off_.resize(groups_.size());
  linear_index_.assign(n_layers, -1);
  const std::vector<int> linear = paged_linear_layers(config_);
  linear_ = !linear.empty();
  if (!linear.empty()) {
    const LinearStateShape& ls = config_.linear;
    if (ls.conv_kernel < 1 || ls.conv_dim < 1 || ls.heads_v < 1 || ls.head_dim_k < 1 ||
        ls.head_dim_v < 1)
      bad("layer " + std::to_string(linear[0]) +
          " is linear_attention but the store has no valid linear state shape (conv_kernel " +
          std::to_string(ls.conv_kernel) + ", conv_dim " + std::to_string(ls.conv_dim) +
          ", heads_v " + std::to_string(ls.heads_v) + ", head_dim_k " +
          std::to_string(ls.head_dim_k) + ", head_dim_v " + std::to_string(ls.head_dim_v) +
          "); set PagedStoreConfig::linear from the model's cache config");
    if (config_.linear_slots < 0 || config_.max_snapshots < 0 || config_.snapshot_every_blocks < 1)
      bad("linear_slots and max_snapshots must be >= 0 and snapshot_every_blocks >= 1 (got " +
          std::to_string(config_.linear_slots) + ", " + std::to_string(config_.max_snapshots) +
          ", " + std::to_string(config_.snapshot_every_blocks) + ")");
    for (size_t i = 0; i < linear.size(); ++i)
      linear_index_[static_cast<size_t>(linear[i])] = static_cast<int>(i);
    const LinearSlotLayout layout = linear_layout(config_);
    const int32_t n = linear_slot_count(config_);
    snaps_ = std::make_unique<LinearSnapshotStore>(layout.slot_elems(), config_.max_snapshots);
    conv_prev_ws_ = Tensor::zeros(DType::kF32, {n, ls.conv_kernel - 1, ls.conv_dim});
    conv_ws_ = Tensor::zeros(DType::kF32, {n, ls.conv_kernel - 1, ls.conv_dim});
    rec_ws_ = Tensor::zeros(DType::kF32, {n, ls.heads_v, ls.head_dim_k, ls.head_dim_v});
    // Snapshots are dropped with their blocks' keys: install_pool_hooks.
  }
  if (has_state(config_)) {
    if (config_.linear_slots < 0) bad("linear_slots must be >= 0");
    int64_t off = linear_layout(config_).layer_elems() * static_cast<int64_t>(linear.size());
    for (const int l : compressed_layers_) {
      cstate_offset_[static_cast<size_t>(l)] = off;
      off += layer_compressor_elems(config_, config_.layer_types[static_cast<size_t>(l)]);
    }
    slots_ = std::make_unique<LinearStateSlots>(linear_layout(config_), linear_slot_count(config_));
  }
  if (config_.kv_heads > 0 && config_.head_dim > 0)
    allocate_pages(config_.kv_heads, config_.head_dim,
                   config_.head_dim_v > 0 ? config_.head_dim_v : config_.head_dim);
  install_pool_hooks();
  build_tables();
}

void PagedKVStore::allocate_pages(int64_t kv_heads, int64_t head_dim, int64_t head_dim_v) {
  config_.kv_heads = kv_heads;
  config_.head_dim = head_dim;
  config_.head_dim_v = head_dim_v;
  if (config_.quant) {
    allocate_quant(kv_heads, head_dim, head_dim_v);
    return;
  }
  const int64_t bt = config_.block_tokens, ci = config_.compressed.index_head_dim;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const int32_t nb = config_.group_blocks[g];
    for (const int l : groups_[g].layers) {
      if (!paged_layer_owns_pages(config_, l)) continue;  // KV-shared: reads its source's pages
      const std::string& type = config_.layer_types[static_cast<size_t>(l)];
      if (groups_[g].kind == GroupKind::kCompressed) {  // entries (and CSA's indexer keys)
        c_pages_[static_cast<size_t>(l)] = Tensor::zeros(config_.dtype, {nb, 1, bt, head_dim});
        if (is_csa(type))
          x_pages_[static_cast<size_t>(l)] = Tensor::zeros(config_.dtype, {nb, 1, bt, ci});
        continue;
      }
      if (is_indexed_layer_type(type))  // DSA: one indexer key per token
        x_pages_[static_cast<size_t>(l)] = Tensor::zeros(config_.dtype, {nb, 1, bt, ci});
      for (const auto& [pages, d] :
           {std::pair{&k_pages_, head_dim}, std::pair{&v_pages_, head_dim_v}}) {
        if (pages == &v_pages_ && paged_layer_k_only(config_, l)) continue;  // K==V
        Tensor& t = (*pages)[static_cast<size_t>(l)];
        t = Tensor::empty(config_.dtype,
                          {config_.group_blocks[g], kv_heads, config_.block_tokens, d});
        if (has_null_block(static_cast<int>(g)))  // the null page reads as zeros
          std::memset(t.data(), 0, dtype_bytes(config_.dtype, kv_heads * config_.block_tokens * d));
      }
    }
  }
}

void PagedKVStore::allocate_quant(int64_t kv_heads, int64_t head_dim, int64_t head_dim_v) {
  qfmt_ = paged_quant_format(config_);  // throws for a format these head dims cannot take
  kbb_ = kv_k_block_bytes(qfmt_);
  vbb_ = kv_v_block_bytes(qfmt_);
  const int64_t G = config_.block_tokens, slots = paged_sequence_slots(config_);
  ws_tokens_ = quant_workspace_tokens(config_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto nb = static_cast<size_t>(config_.group_blocks[g]);
    for (const int l : groups_[g].layers) {
      if (!paged_layer_owns_pages(config_, l)) continue;
      const auto li = static_cast<size_t>(l);
      kq_[li] = ByteBuffer(nb * static_cast<size_t>(kv_heads * kbb_));
      vq_[li] = ByteBuffer(nb * static_cast<size_t>(kv_heads * vbb_));
      rk_[li] = Tensor::zeros(config_.dtype, {slots, kv_heads, G, head_dim});
      rv_[li] = Tensor::zeros(config_.dtype, {slots, kv_heads, G, head_dim_v});
      wk_[li] = Tensor::zeros(config_.dtype, {ws_tokens_ * kv_heads * head_dim});
      wv_[li] = Tensor::zeros(config_.dtype, {ws_tokens_ * kv_heads * head_dim_v});
    }
  }
  qscratch_.assign(static_cast<size_t>(G * std::max(head_dim, head_dim_v)), 0.0f);
}

std::vector<uint8_t> PagedKVStore::keyed_salt(std::span<const uint8_t> salt,
                                              const KVPolicy& policy) const {
  std::vector<uint8_t> out;
  if (!policy.exact()) {
    // The policy and its parameters are part of every block key: a block computed under a
    // lossy policy never serves a request that asked for exact attention, nor another policy.
    const std::string tag = "kvcache kv policy v1 " + policy.key();
    out.assign(tag.begin(), tag.end());
    out.push_back(0);
  }
  if (config_.quant) {
    // The format is part of every block key: the same tokens under f16 pages, 2-bit or 4-bit
    // pages are different blocks (an f16 request never reads a 4-bit block, nor the reverse).
    const char tag[] = "kvcache quantized pages v1";
    out.insert(out.end(), tag, tag + sizeof(tag));
    const auto G = static_cast<uint32_t>(config_.block_tokens);
    out.push_back(static_cast<uint8_t>(config_.quant->scheme));
    out.push_back(static_cast<uint8_t>(config_.quant->bits));
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(G >> (8 * i)));
  }
  out.insert(out.end(), salt.begin(), salt.end());
  return out;
}

size_t PagedKVStore::quant_state_bytes() const {
  size_t total = qscratch_.size() * sizeof(float);
  for (size_t l = 0; l < rk_.size(); ++l)
    total += rk_[l].size_bytes() + rv_[l].size_bytes() + wk_[l].size_bytes() + wv_[l].size_bytes();
  return total;
}

void PagedKVStore::attach_layer(int layer) {
  KV_CHECK(layer >= 0 && layer < static_cast<int>(attached_.size()), "layer outside the store");
  if (!attached_[static_cast<size_t>(layer)]) ++n_attached_;
  attached_[static_cast<size_t>(layer)] = 1;
}

int PagedKVStore::leader_layer() const {
  for (size_t l = 0; l < attached_.size(); ++l)
    if (attached_[l]) return static_cast<int>(l);
  return -1;
}

PagedKVStore::Seq& PagedKVStore::seq_ref(SeqId seq) {
  return const_cast<Seq&>(static_cast<const PagedKVStore&>(*this).seq_ref(seq));
}

const PagedKVStore::Seq& PagedKVStore::seq_ref(SeqId seq) const {
  if (seq < 0 || seq >= static_cast<SeqId>(seqs_.size()) || !seqs_[static_cast<size_t>(seq)].live)
    bad("sequence " + std::to_string(seq) + " does not exist");
  return seqs_[static_cast<size_t>(seq)];
}

bool PagedKVStore::is_live(SeqId seq) const {
  return seq >= 0 && seq < static_cast<SeqId>(seqs_.size()) && seqs_[static_cast<size_t>(seq)].live;
}

int64_t PagedKVStore::length(SeqId seq) const {
  return seq_ref(seq).len;
}

SeqId PagedKVStore::add_sequence(std::span<const uint8_t> salt, const KVPolicy& policy) {
  if (!policy.exact()) {
    if (policy.kind != KVPolicyKind::kStreaming)
      bad("the paged store evicts whole blocks shared between sequences, so it runs only "
          "policies that choose by position: --kv-policy " +
              policy.key() +
              " chooses tokens per KV head by attention, which no shared block can follow; use "
              "streaming:sink=S,window=W or exact here (or the dynamic/static caches of "
              "generate)",
          ErrorKind::kUnsupported);
    if (!config_.streaming)
      bad("sequence under --kv-policy " + policy.key() +
              ": this store was built without PagedStoreConfig::streaming (its full-attention "
              "groups have no null block to stand in for released blocks); start the server "
              "with a streaming --kv-policy",
          ErrorKind::kUnsupported);
    policy.validate();
  }
  const SeqId id = new_sequence(keyed_salt(salt, policy));
  seqs_[static_cast<size_t>(id)].policy = policy;
  return id;
}

bool PagedKVStore::has_null_block(int g) const {
  const GroupKind k = groups_[static_cast<size_t>(g)].kind;
  return k == GroupKind::kSliding || (k == GroupKind::kFull && config_.streaming);
}

bool PagedKVStore::streams(int g, const Seq& s) const {
  return s.policy.kind == KVPolicyKind::kStreaming &&
         groups_[static_cast<size_t>(g)].kind == GroupKind::kFull;
}

SeqId PagedKVStore::new_sequence(std::vector<uint8_t> keyed) {
  if (config_.quant && qfree_.empty())
    bad("all " + std::to_string(paged_sequence_slots(config_)) +
            " residual slots of the quantized pages are in use (one per live sequence: its "
            "tokens past its last full block, in the storage dtype); free a sequence first or "
            "build the store with more linear_slots (the engine's max_running)",
        ErrorKind::kOutOfRange);
  if (slots_ && slots_->num_free() == 0)
    bad("all " + std::to_string(slots_->num_slots()) +
            " linear-attention state slots are in use (one per live sequence of a model with "
            "linear-attention or compressed layers, whose compressors' state they also hold); "
            "free a sequence first or build the store with more linear_slots (the engine's "
            "max_running)",
        ErrorKind::kOutOfRange);
  SeqId id = 0;
  while (id < static_cast<SeqId>(seqs_.size()) && seqs_[static_cast<size_t>(id)].live) ++id;
  if (id == static_cast<SeqId>(seqs_.size())) seqs_.emplace_back();
  Seq& s = seqs_[static_cast<size_t>(id)];
  s = Seq{};
  s.live = true;
  s.salt = std::move(keyed);  // the format folded in (keyed_salt)
  s.tables.resize(groups_.size());
  s.keys.resize(groups_.size());
  if (slots_) s.slot = slots_->acquire();
  if (config_.quant) {
    s.qslot = qfree_.back();
    qfree_.pop_back();
  }
  return id;
}

void PagedKVStore::drop_seq(Seq& s) {
  release_seq_blocks(s);
  if (slots_ && s.slot >= 0) slots_->release(s.slot);
  if (s.qslot >= 0) qfree_.push_back(s.qslot);
  s = Seq{};
}

void PagedKVStore::release_seq_blocks(Seq& s) {
  const int64_t bt = config_.block_tokens, full = s.len / bt, part = s.len % bt;
  for (size_t g = 0; g < groups_.size(); ++g) {
    // The last partial block keeps its rows for a prompt that continues this sequence (a chat's
    // next turn): released, it stays cached until evicted, found by a prefix's tail lookup.
    std::vector<int32_t>& t = s.tables[g];
    // (Quantized pages: the partial block's rows are in the residual slot, not its page.)
    if (groups_[g].kind != GroupKind::kCompressed && !config_.quant && s.tokens_known && part > 0 &&
        static_cast<int64_t>(t.size()) == full + 1 &&
        static_cast<int64_t>(s.keys[g].size()) == full && !is_null(static_cast<int>(g), t.back()) &&
        pools_[g]->ref_count(t.back()) == 1 && !pools_[g]->is_keyed(t.back()))
      pools_[g]->keep_tail(
          t.back(), full == 0 ? BlockKey{} : s.keys[g].back(), s.salt,
          std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(full * bt)));
    pools_[g]->release_table(s.tables[g]);
    s.tables[g].clear();
    s.keys[g].clear();
  }
}

void PagedKVStore::free_sequence(SeqId seq) {
  if (step_open_) bad("free_sequence during an unfinished step");
  drop_seq(seq_ref(seq));
  const auto it = std::find(batch_.begin(), batch_.end(), seq);
  if (it != batch_.end()) {
    batch_.erase(it);
    build_tables();
  }
}

void PagedKVStore::set_batch(std::span<const SeqId> seqs) {
  if (step_open_) bad("set_batch during an unfinished step");
  for (size_t i = 0; i < seqs.size(); ++i) {
    seq_ref(seqs[i]);
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i])
        bad("sequence " + std::to_string(seqs[i]) + " appears twice in the batch");
  }
  batch_.assign(seqs.begin(), seqs.end());
  build_tables();
}

int64_t PagedKVStore::group_slots(int g, int64_t len) const {
  const PagedGroup& grp = groups_[static_cast<size_t>(g)];
  return grp.kind == GroupKind::kCompressed ? len / grp.rate : len;
}

int64_t PagedKVStore::group_blocks_for(int g, int64_t len) const {
  return ceil_div(group_slots(g, len), config_.block_tokens);
}

int64_t PagedKVStore::first_visible(int g, int64_t pos) const {
  const PagedGroup& grp = groups_[static_cast<size_t>(g)];
  return grp.kind == GroupKind::kSliding ? std::max<int64_t>(0, pos - grp.window + 1) : 0;
}

int64_t PagedKVStore::first_visible(int g, const Seq& s, int64_t pos) const {
  // Streaming: the window of a query at pos (W keys, itself included); the sinks are kept apart.
  if (streams(g, s)) return std::max<int64_t>(0, pos - s.policy.window + 1);
  return first_visible(g, pos);
}

void PagedKVStore::drop_out_of_window(int g, Seq& s, int64_t next_pos) {
  if (groups_[static_cast<size_t>(g)].kind != GroupKind::kSliding && !streams(g, s)) return;
  // A rollback bound keeps what a query that many positions back sees (set_rollback_tokens):
  // first_visible is monotone, so every crop of at most that many tokens finds its keys.
  const int64_t lo = streams(g, s)
                         ? first_visible(g, s, next_pos)
                         : first_visible(g, std::max<int64_t>(0, next_pos - rollback_tokens_));
  const int64_t bt = config_.block_tokens;
  // Streaming: the blocks holding the first `sink` tokens stay.
  const size_t first = streams(g, s) ? static_cast<size_t>(ceil_div(s.policy.sink, bt)) : 0;
  std::vector<int32_t>& table = s.tables[static_cast<size_t>(g)];
  BlockPool& pool = *pools_[static_cast<size_t>(g)];
  for (size_t i = first; i < table.size() && static_cast<int64_t>(i + 1) * bt <= lo; ++i) {
    if (table[i] == 0) continue;
    pool.release(table[i]);
    pool.retain(0);
    table[i] = 0;
    if (!streams(g, s)) continue;
    // From now on the sequence's tokens are computed without these keys: its later blocks
    // depend on where its steps ended and are never keyed (see the header).
    ++s.evicted;
    s.tokens_known = false;
    s.tokens.clear();
  }
}

void PagedKVStore::build_tables() {
  const int64_t bt = config_.block_tokens;
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::vector<int32_t>& indptr = indptr_[g];
    std::vector<int32_t>& indices = indices_[g];
    std::vector<int32_t>& last = last_len_[g];
    std::vector<int64_t>& row_off = row_off_[g];
    row_off.clear();
    indptr.assign(1, 0);
    indices.clear();
    indices.reserve(1);  // data() set even when no sequence holds a block yet
    last.clear();
    for (const SeqId id : batch_) {
      const Seq& s = seqs_[static_cast<size_t>(id)];
      const std::vector<int32_t>& t = s.tables[g];
      const int64_t n = group_slots(static_cast<int>(g), s.len);
      KV_CHECK(static_cast<int64_t>(t.size()) == ceil_div(n, bt),
               "table size != ceil(len / block)");
      if (streams(static_cast<int>(g), s) && s.evicted > 0) {  // compacted: sinks, then window
        for (const int32_t id : t)
          if (id != 0) indices.push_back(id);
        row_off.push_back(s.evicted * bt);
      } else {
        row_off.push_back(0);
        indices.insert(indices.end(), t.begin(), t.end());
      }
      indptr.push_back(static_cast<int32_t>(indices.size()));
      last.push_back(n == 0 ? 0 : static_cast<int32_t>((n - 1) % bt + 1));
    }
  }
}

StepStatus PagedKVStore::plan_step(int64_t n_tokens, std::span<const int32_t> tokens) {
  if (step_open_) bad("plan_step: the previous step has not been written by every layer");
  if (batch_.empty()) bad("plan_step: the batch is empty (set_batch first)");
  if (n_tokens <= 0) bad("plan_step: needs at least one token per sequence");
  const auto B = static_cast<int64_t>(batch_.size());
  if (!tokens.empty() && static_cast<int64_t>(tokens.size()) != B * n_tokens)
    bad("plan_step: " + std::to_string(tokens.size()) + " token ids for a batch of " +
        std::to_string(B) + " x " + std::to_string(n_tokens));
  if (config_.quant && B * n_tokens > paged_quant_step_tokens(config_))
    bad("plan_step: " + std::to_string(B) + " x " + std::to_string(n_tokens) +
        " tokens in one step, but the quantized pages' step workspaces hold " +
        std::to_string(paged_quant_step_tokens(config_)) +
        " (PagedStoreConfig::max_step_tokens, the plan's max_tokens_per_step); split the step");
  for (const SeqId id : batch_)
    if (seqs_[static_cast<size_t>(id)].state_lost)
      bad("plan_step: sequence " + std::to_string(id) +
          " lost its linear-attention state (or its compressors' state) in an aborted step; "
          "free it (or crop it to 0) and recompute it");
  // Blocks out of every window are dropped first: no later query of the sequence can see them,
  // so this is neutral even when the step is then refused.
  // Streaming sequences release only when a step closes: after a prefix hit, the first step
  // sees every attached block, as the step that computed them saw them (so a hit on a repeated
  // prompt continues as its first run did).
  for (const SeqId id : batch_)
    for (int g = 0; g < num_groups(); ++g)
      if (!streams(g, seqs_[static_cast<size_t>(id)]))
        drop_out_of_window(g, seqs_[static_cast<size_t>(id)], seqs_[static_cast<size_t>(id)].len);
  for (size_t g = 0; g < groups_.size(); ++g) {
    int64_t need = 0;
    for (const SeqId id : batch_) {
      const Seq& s = seqs_[static_cast<size_t>(id)];
      need += group_blocks_for(static_cast<int>(g), s.len + n_tokens) -
              static_cast<int64_t>(s.tables[g].size());
    }
    if (need > pools_[g]->num_available()) return StepStatus::kOutOfBlocks;
  }
  step_base_.resize(batch_.size());
  for (size_t b = 0; b < batch_.size(); ++b) {
    Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    for (size_t g = 0; g < groups_.size(); ++g) {
      const int64_t need = group_blocks_for(static_cast<int>(g), s.len + n_tokens) -
                           static_cast<int64_t>(s.tables[g].size());
      KV_CHECK(pools_[g]->allocate(static_cast<int32_t>(need), s.tables[g]),
               "blocks checked above");
    }
    if (tokens.empty()) {
      s.tokens_known = false;
      s.tokens.clear();
    } else if (s.tokens_known) {
      const auto row =
          tokens.subspan(b * static_cast<size_t>(n_tokens), static_cast<size_t>(n_tokens));
      s.tokens.insert(s.tokens.end(), row.begin(), row.end());
    }
    step_base_[b] = s.len;
    s.len += n_tokens;
  }
  step_tokens_ = n_tokens;
  step_open_ = true;
  if (config_.quant) {  // rows whose residual would pass a block gather in the workspace
    const int64_t G = config_.block_tokens;
    ws_off_.assign(batch_.size(), -1);
    int64_t at = 0;
    for (size_t b = 0; b < batch_.size(); ++b) {
      const int64_t rows = step_base_[b] % G + n_tokens;
      if (rows <= G) continue;
      ws_off_[b] = at;
      at += rows;
    }
    KV_CHECK(ws_tokens_ == 0 || at <= ws_tokens_, "step checked against max_step_tokens above");
  }
  step_writes_ = 0;
  std::fill(step_wrote_.begin(), step_wrote_.end(), 0);
  std::fill(kv_written_.begin(), kv_written_.end(), 0);
  std::fill(x_written_.begin(), x_written_.end(), 0);
  std::fill(step_parts_.begin(), step_parts_.end(), 0);
  for (const int l : compressed_layers_)
    for (int st = 0; st < 2; ++st) {
      StreamStep& ss = streams_[static_cast<size_t>(l * 2 + st)];
      ss.fed.assign(batch_.size(), 0);
      ss.windows.assign(batch_.size(), 0);
    }
  build_tables();
  return StepStatus::kOk;
}

int64_t PagedKVStore::layer_length(int layer) const {
  if (batch_.empty()) return 0;
  const int64_t len = seqs_[static_cast<size_t>(batch_[0])].len;
  return step_open_ && !step_wrote_[static_cast<size_t>(layer)] ? len - step_tokens_ : len;
}

KVSpan PagedKVStore::write(int layer, const TensorView& k, const TensorView& v) {
  fault::point("paged_store.write");
  const std::string where = "layer " + std::to_string(layer) + ": ";
  if (k.ndim() != 4 || v.ndim() != 4 || k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) ||
      k.dim(2) != v.dim(2))
    bad(where + "k and v must be [B, H_kv, S, D_k] and [B, H_kv, S, D_v] (same B, H_kv, S)");
  if (!dtype_is_float(k.dtype()) || !dtype_is_float(v.dtype()))
    bad(where + "k and v must be float tensors");
  if (layer < 0 || layer >= static_cast<int>(k_pages_.size()))
    bad(where + "outside the store's layers");
  if (!paged_layer_owns_pages(config_, layer))
    bad(where + "is KV-shared (one of the last " + std::to_string(config_.num_kv_shared_layers) +
        " layers) and owns no pages; it reads its source layer's span");
  const auto shape_text = [](int64_t h, int64_t dk, int64_t dv) {
    return std::to_string(h) + " heads of K " + std::to_string(dk) + " / V " + std::to_string(dv);
  };
  const int64_t want_dv = config_.head_dim_v > 0 ? config_.head_dim_v : config_.head_dim;
  if (!allocated()) {
    if (config_.kv_heads > 0 &&
        (k.dim(1) != config_.kv_heads || k.dim(3) != config_.head_dim || v.dim(3) != want_dv))
      bad(where + "k/v have " + shape_text(k.dim(1), k.dim(3), v.dim(3)) +
          ", the store was configured for " +
          shape_text(config_.kv_heads, config_.head_dim, want_dv));
    allocate_pages(k.dim(1), k.dim(3), v.dim(3));
  }
  if (k.dim(1) != config_.kv_heads || k.dim(3) != config_.head_dim ||
      v.dim(3) != config_.head_dim_v)
    bad(where + "k/v have " + shape_text(k.dim(1), k.dim(3), v.dim(3)) + ", the pages hold " +
        shape_text(config_.kv_heads, config_.head_dim, config_.head_dim_v));
  const bool k_only = paged_layer_k_only(config_, layer);
  if (k_only && (k.data() != v.data() || k.strides() != v.strides() || k.dim(3) != v.dim(3)))
    bad(where + "a K==V layer (" + config_.layer_types[static_cast<size_t>(layer)] +
        (config_.shared_kv ? ", shared KV" : "") +
        ") stores k once: pass the same view as k and v (update(kv, kv))");
  open_step_if_needed(where, k.dim(0), k.dim(2));
  if (step_wrote_[static_cast<size_t>(layer)] || kv_written_[static_cast<size_t>(layer)])
    bad(where + "updated twice in one step");

  if (config_.quant) {
    write_quant(layer, k, v);
    kv_written_[static_cast<size_t>(layer)] = 1;
    const KVSpan span = peek_span(layer);  // before part_done closes the step (and quantizes)
    part_done(layer);
    return span;
  }
  const int g = layer_group_[static_cast<size_t>(layer)];
  const int64_t bt = config_.block_tokens, H = config_.kv_heads;
  const TensorView kp = k_pages_[static_cast<size_t>(layer)].view();
  const TensorView vp = k_only ? kp : v_pages_[static_cast<size_t>(layer)].view();
  const auto dk = static_cast<size_t>(config_.head_dim),
             dv = static_cast<size_t>(config_.head_dim_v);
  for (size_t b = 0; b < batch_.size(); ++b) {
    const std::vector<int32_t>& table =
        seqs_[static_cast<size_t>(batch_[b])].tables[static_cast<size_t>(g)];
    const auto bi = static_cast<int64_t>(b);
    for (int64_t s = 0; s < step_tokens_; ++s) {
      const int64_t pos = step_base_[b] + s;
      const int32_t blk = table[static_cast<size_t>(pos / bt)];
      const int64_t slot = pos % bt;
      for (int64_t h = 0; h < H; ++h) {
        convert_n(k.ptr(bi, h, s), k.dtype(), kp.ptr(blk, h, slot), config_.dtype, dk);
        if (!k_only) convert_n(v.ptr(bi, h, s), v.dtype(), vp.ptr(blk, h, slot), config_.dtype, dv);
      }
    }
  }
  kv_written_[static_cast<size_t>(layer)] = 1;
  const KVSpan span = peek_span(layer);  // before part_done may close the step
  part_done(layer);
  return span;
}

int64_t PagedKVStore::parts_needed(int layer) const {
  const std::string& t = config_.layer_types[static_cast<size_t>(layer)];
  if (is_indexed_layer_type(t)) return 2;  // K/V and the indexer keys
  if (!is_compressed_layer_type(t)) return 1;
  // The window, then every batch row's streams.
  return 1 + static_cast<int64_t>(batch_.size()) * (has_indexer_stream(layer) ? 2 : 1);
}

void PagedKVStore::part_done(int layer) {
  if (++step_parts_[static_cast<size_t>(layer)] >= parts_needed(layer)) layer_done(layer);
}

void PagedKVStore::open_step_if_needed(const std::string& where, int64_t rows, int64_t tokens) {
  if (batch_.empty() && !step_open_) {
    // Protocol use without a runtime: the batch rows become fresh sequences (lazy init).
    for (int64_t b = 0; b < rows; ++b) batch_.push_back(add_sequence());
    build_tables();
  }
  if (rows != static_cast<int64_t>(batch_.size()))
    bad(where + "update of " + std::to_string(rows) + " rows for a batch of " +
        std::to_string(batch_.size()) + " sequences");
  if (!step_open_ && plan_step(tokens) == StepStatus::kOutOfBlocks)
    bad(where + "out of blocks for " + std::to_string(tokens) + " more tokens of " +
            std::to_string(batch_.size()) + " sequences; raise the KV budget or free sequences",
        ErrorKind::kOutOfRange);
  if (tokens != step_tokens_)
    bad(where + "update of " + std::to_string(tokens) + " tokens in a step planned for " +
        std::to_string(step_tokens_));
}

void PagedKVStore::layer_done(int layer) {
  if (step_wrote_[static_cast<size_t>(layer)])
    bad("layer " + std::to_string(layer) + ": updated twice in one step");
  step_wrote_[static_cast<size_t>(layer)] = 1;
  if (!attached_[static_cast<size_t>(layer)]) attach_layer(layer);  // direct store use
  if (++step_writes_ >= n_attached_) {
    step_open_ = false;
    // Key the blocks that became full, then let sliding groups drop what the next query
    // cannot see (dropped blocks stay cached under their keys). The tables the returned span
    // points at are rebuilt only at the next step, so this step's spans stay valid.
    // Quantized pages: the blocks that became full get their bytes first (a commit's event
    // sinks read them).
    if (config_.quant) quantize_closed_step();
    for (const SeqId id : batch_) {
      Seq& s = seqs_[static_cast<size_t>(id)];
      commit_full_blocks(s);
      take_snapshot(s);
      for (int gg = 0; gg < num_groups(); ++gg) drop_out_of_window(gg, s, s.len);
    }
  }
}

void PagedKVStore::take_snapshot(const Seq& s) {
  if (!snaps_ || snaps_->capacity() == 0 || !s.tokens_known || s.len == 0) return;
  const int64_t every = static_cast<int64_t>(config_.snapshot_every_blocks) * config_.block_tokens;
  if (s.len % every != 0) return;
  const std::vector<BlockKey>& keys = s.keys[0];
  if (static_cast<int64_t>(keys.size()) * config_.block_tokens != s.len) return;
  snaps_->put(keys.back(), s.len, slots_->slot_data(s.slot));
}

void PagedKVStore::abort_step() {
  if (!step_open_) return;
  for (size_t b = 0; b < batch_.size(); ++b) {
    Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    // Linear layers may have updated the state in place: it is no longer the state at the
    // restored length (plan_step refuses the sequence until it is freed or cropped to 0).
    if (slots_) s.state_lost = true;
    s.len = step_base_[b];
    if (s.tokens_known) s.tokens.resize(static_cast<size_t>(s.len));
    for (size_t g = 0; g < groups_.size(); ++g) {
      std::vector<int32_t>& table = s.tables[g];
      const auto keep = static_cast<size_t>(group_blocks_for(static_cast<int>(g), s.len));
      while (table.size() > keep) {
        pools_[g]->release(table.back());
        table.pop_back();
      }
    }
  }
  step_open_ = false;
  step_writes_ = 0;
  std::fill(step_wrote_.begin(), step_wrote_.end(), 0);
  std::fill(step_parts_.begin(), step_parts_.end(), 0);
  build_tables();
}

KVSpan PagedKVStore::peek_span(int layer) const {
  KV_CHECK(allocated(), "peek_span before the pages exist");
  KV_CHECK(paged_layer_owns_pages(config_, layer),
           "peek_span of a KV-shared layer (it owns no pages)");
  if (config_.quant) return quant_span(layer);
  const auto g = static_cast<size_t>(layer_group_[static_cast<size_t>(layer)]);
  KVSpan span;
  span.kind = KVSpanKind::kPaged;
  span.kv_offset = 0;
  PagedKV& p = span.paged;
  p.k_pages = k_pages_[static_cast<size_t>(layer)].view();
  p.v_pages =
      paged_layer_k_only(config_, layer) ? p.k_pages : v_pages_[static_cast<size_t>(layer)].view();
  p.batch = static_cast<int64_t>(batch_.size());
  p.block_tokens = config_.block_tokens;
  p.indptr = indptr_[g].data();
  p.indices = indices_[g].data();
  p.last_page_len = last_len_[g].data();
  p.row_offset = row_off_[g].data();
  return span;
}

void PagedKVStore::write_quant(int layer, const TensorView& k, const TensorView& v) {
  const auto li = static_cast<size_t>(layer);
  const int64_t G = config_.block_tokens, H = config_.kv_heads, n = step_tokens_;
  for (size_t b = 0; b < batch_.size(); ++b) {
    const Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    const int64_t tail = step_base_[b] % G, bi = static_cast<int64_t>(b);
    for (const auto& [src, res, ws, d] : {std::tuple{&k, &rk_[li], &wk_[li], config_.head_dim},
                                          std::tuple{&v, &rv_[li], &wv_[li], config_.head_dim_v}}) {
      const TensorView r = res->view();
      const size_t row = dtype_bytes(config_.dtype, d);
      for (int64_t h = 0; h < H; ++h) {
        std::byte* dst = static_cast<std::byte*>(r.ptr(s.qslot, h, tail));
        if (ws_off_[b] >= 0) {  // [tail | new] of this head, contiguous in the workspace
          const int64_t m = tail + n;
          std::byte* base =
              static_cast<std::byte*>(ws->data()) +
              static_cast<size_t>((ws_off_[b] * H + h * m) * d) * dtype_bytes(config_.dtype, 1);
          if (tail > 0) std::memcpy(base, r.ptr(s.qslot, h, 0), row * static_cast<size_t>(tail));
          dst = base + row * static_cast<size_t>(tail);
        }
        for (int64_t t = 0; t < n; ++t)
          convert_n(src->ptr(bi, h, t), src->dtype(), dst + row * static_cast<size_t>(t),
                    config_.dtype, static_cast<size_t>(d));
      }
    }
  }
}

KVSpan PagedKVStore::quant_span(int layer) const {
  const auto li = static_cast<size_t>(layer);
  const auto g = static_cast<size_t>(layer_group_[li]);
  const int64_t G = config_.block_tokens, H = config_.kv_heads;
  const int64_t dk = config_.head_dim, dv = config_.head_dim_v;
  // During a step, a layer that wrote reads the blocks full before the step and its rows after
  // them (the old tail and the step's tokens); otherwise the blocks full now and the tail.
  const bool in_step = step_open_;
  const bool wrote = kv_written_[li] != 0;
  std::vector<QuantKV>& rows = qrows_[li];
  std::vector<int64_t>& off = qoff_[li];
  rows.assign(batch_.size(), QuantKV{});
  off.assign(batch_.size(), 0);
  for (size_t b = 0; b < batch_.size(); ++b) {
    const Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    const int64_t before = in_step && b < step_base_.size() ? step_base_[b] : s.len;
    const int64_t full = before / G;
    int64_t res = before % G;
    const bool use_ws = in_step && wrote && b < ws_off_.size() && ws_off_[b] >= 0;
    if (in_step && wrote) res += step_tokens_;
    // Sliding groups: the released (null) blocks lead the table; the span starts after them.
    const int32_t* ids = indices_[g].data() + indptr_[g][b];
    int64_t first = 0;
    if (groups_[g].kind == GroupKind::kSliding)
      while (first < full && ids[first] == 0) ++first;
    QuantKV& q = rows[b];
    q.scheme = qfmt_.scheme;
    q.bits = qfmt_.bits;
    q.group = G;
    q.v_group = qfmt_.v_group;
    q.batch = 1;
    q.heads = H;
    q.head_dim_k = dk;
    q.head_dim_v = dv;
    q.n_blocks = full - first;
    q.k_blocks = kq_[li].data();
    q.v_blocks = vq_[li].data();
    q.k_block_bytes = kbb_;
    q.v_block_bytes = vbb_;
    q.k_head_stride = kbb_;
    q.v_head_stride = vbb_;
    q.k_page_stride = H * kbb_;
    q.v_page_stride = H * vbb_;
    q.block_ids = ids + first;
    if (use_ws) {
      const size_t e = dtype_bytes(config_.dtype, 1);
      auto* kb = static_cast<std::byte*>(const_cast<void*>(wk_[li].data())) +
                 static_cast<size_t>(ws_off_[b] * H * dk) * e;
      auto* vb = static_cast<std::byte*>(const_cast<void*>(wv_[li].data())) +
                 static_cast<size_t>(ws_off_[b] * H * dv) * e;
      q.k_residual =
          TensorView(kb, config_.dtype, {1, H, res, dk}, {H * res * dk, res * dk, dk, 1});
      q.v_residual =
          TensorView(vb, config_.dtype, {1, H, res, dv}, {H * res * dv, res * dv, dv, 1});
    } else {
      q.k_residual = rk_[li].view().slice(0, s.qslot, s.qslot + 1).slice(2, 0, res);
      q.v_residual = rv_[li].view().slice(0, s.qslot, s.qslot + 1).slice(2, 0, res);
    }
    off[b] = first * G;
  }
  KVSpan span;
  span.kind = KVSpanKind::kPagedQuantized;
  span.paged_quant.batch = static_cast<int64_t>(batch_.size());
  span.paged_quant.rows = rows.data();
  span.paged_quant.kv_offset = off.data();
  return span;
}

void PagedKVStore::quantize_closed_step() {
  const int64_t G = config_.block_tokens, H = config_.kv_heads;
  const size_t e = dtype_bytes(config_.dtype, 1);
  float* f = qscratch_.data();
  for (size_t l = 0; l < kq_.size(); ++l) {
    if (!kv_written_[l] || kq_[l].size() == 0) continue;
    const auto g = static_cast<size_t>(layer_group_[l]);
    for (size_t b = 0; b < batch_.size(); ++b) {
      const Seq& s = seqs_[static_cast<size_t>(batch_[b])];
      const int64_t full0 = step_base_[b] / G, full1 = s.len / G, rem = s.len % G;
      const int64_t m = step_base_[b] % G + step_tokens_;  // rows after block full0
      for (const bool keys : {true, false}) {
        const TensorView r = (keys ? rk_[l] : rv_[l]).view();
        std::byte* const ws = static_cast<std::byte*>((keys ? wk_[l] : wv_[l]).data());
        ByteBuffer* const pages = keys ? &kq_[l] : &vq_[l];
        const int64_t bytes = keys ? kbb_ : vbb_;
        const int64_t d = keys ? config_.head_dim : config_.head_dim_v;
        const int64_t off = ws_off_[b];
        for (int64_t h = 0; h < H; ++h) {
          // Row t (from block full0's first token) of this head.
          const auto row = [&r, &s, ws, off, h, m, d, e, H](int64_t t) -> std::byte* {
            if (off < 0) return static_cast<std::byte*>(r.ptr(s.qslot, h, t));
            return ws + static_cast<size_t>((off * H + h * m + t) * d) * e;
          };
          for (int64_t i = full0; i < full1; ++i) {
            // As QuantizedLayer::flush: each row converted to f32, then one block.
            for (int64_t t = 0; t < G; ++t)
              convert_n(row((i - full0) * G + t), config_.dtype, f + t * d, DType::kF32,
                        static_cast<size_t>(d));
            const int32_t id = s.tables[g][static_cast<size_t>(i)];
            std::byte* blk = pages->data() + static_cast<size_t>((id * H + h) * bytes);
            if (keys)
              kv_quantize_k_block(qfmt_, f, d, blk);
            else
              kv_quantize_v_block(qfmt_, f, d, blk);
          }
          // The leftover rows become the slot's residual (slot rows are already there).
          if (ws_off_[b] >= 0 && rem > 0)
            std::memcpy(r.ptr(s.qslot, h, 0), row((full1 - full0) * G),
                        static_cast<size_t>(rem * d) * e);
        }
      }
    }
  }
}

void PagedKVStore::dequantize_into_slot(int g, int32_t id, int64_t part, int32_t slot) {
  const int64_t H = config_.kv_heads;
  float* f = qscratch_.data();
  for (const int l : groups_[static_cast<size_t>(g)].layers) {
    const auto li = static_cast<size_t>(l);
    if (kq_[li].size() == 0) continue;
    for (int64_t h = 0; h < H; ++h) {
      // As QuantizedLayer::crop: the block dequantized to f32, its kept rows converted back.
      kv_dequantize_k_block(qfmt_, kq_[li].data() + (id * H + h) * kbb_, f, config_.head_dim);
      for (int64_t t = 0; t < part; ++t)
        convert_n(f + t * config_.head_dim, DType::kF32, rk_[li].view().ptr(slot, h, t),
                  config_.dtype, static_cast<size_t>(config_.head_dim));
      kv_dequantize_v_block(qfmt_, vq_[li].data() + (id * H + h) * vbb_, f, config_.head_dim_v);
      for (int64_t t = 0; t < part; ++t)
        convert_n(f + t * config_.head_dim_v, DType::kF32, rv_[li].view().ptr(slot, h, t),
                  config_.dtype, static_cast<size_t>(config_.head_dim_v));
    }
  }
}

void PagedKVStore::copy_slot(int32_t src, int32_t dst, int64_t rows) {
  if (rows <= 0) return;
  for (size_t l = 0; l < rk_.size(); ++l) {
    if (!rk_[l].defined() || rk_[l].size_bytes() == 0) continue;
    for (Tensor* t : {&rk_[l], &rv_[l]}) {
      const TensorView r = t->view();
      for (int64_t h = 0; h < r.dim(1); ++h)
        std::memcpy(r.ptr(dst, h, 0), r.ptr(src, h, 0),
                    dtype_bytes(config_.dtype, rows * r.dim(3)));
    }
  }
}

void PagedKVStore::commit_full_blocks(Seq& s) {
  if (!s.tokens_known) return;
  const int64_t bt = config_.block_tokens;
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].kind == GroupKind::kCompressed) continue;  // never shared (see the header)
    std::vector<BlockKey>& keys = s.keys[g];
    BlockPool& pool = *pools_[g];
    for (auto i = static_cast<int64_t>(keys.size()); (i + 1) * bt <= s.len; ++i) {
      const std::span<const int32_t> tok(s.tokens.data() + i * bt, static_cast<size_t>(bt));
      const BlockKey parent = i == 0 ? BlockKey{} : keys.back();
      const BlockKey key = block_key(parent, static_cast<int32_t>(g), s.salt, tok);
      const int32_t id = s.tables[g][static_cast<size_t>(i)];
      if (!is_null(static_cast<int>(g), id)) {
        if (pool.is_keyed(id))
          KV_CHECK(pool.key(id) == key, "a shared block under a different key");
        else
          pool.commit(id, key, parent, tok);  // false: the same content is indexed elsewhere
      }
      keys.push_back(key);
    }
  }
}

PagedKVStore::PrefixHit PagedKVStore::find_prefix(std::span<const int32_t> tokens,
                                                  std::span<const uint8_t> salt, PrefixMatch mode,
                                                  bool with_disk) {
  PrefixHit hit;
  hit.keys.resize(groups_.size());
  hit.blocks.resize(groups_.size());
  if (tokens.size() <= 1) return hit;
  const int64_t bt = config_.block_tokens;
  const int64_t nj =
      static_cast<int64_t>(tokens.size() - 1) / bt;  // full blocks, last token excluded
  // ok[j]: every group can serve the first j blocks.
  std::vector<uint8_t> ok(static_cast<size_t>(nj + 1), 1);
  std::vector<std::vector<BlockKey>>& keys = hit.keys;  // of every full block, cut to j below
  std::vector<std::vector<int32_t>>& ids = hit.blocks;
  for (int g = 0; g < num_groups(); ++g) {
    if (groups_[static_cast<size_t>(g)].kind == GroupKind::kCompressed) continue;
    BlockKey parent;
    for (int64_t i = 0; i < nj; ++i) {
      const std::span<const int32_t> tok =
          tokens.subspan(static_cast<size_t>(i * bt), static_cast<size_t>(bt));
      parent = block_key(parent, g, salt, tok);
      keys[static_cast<size_t>(g)].push_back(parent);
      int32_t id = pools_[static_cast<size_t>(g)]->lookup(parent, tok);
      if (id < 0 && with_disk && disk_ && disk_->contains(parent, g)) id = kOnDisk;
      if (id < 0 && with_disk && staged(g, i, parent)) id = kOnRemote;
      ids[static_cast<size_t>(g)].push_back(id);
    }
    // Blocks the next query (at position j * bt) can see, [lo / bt, j), must all be present:
    // missing[i] counts the absent blocks before block i, so each j is one subtraction (a
    // 32K-token prompt has 2,048 blocks; testing each j's blocks one by one was quadratic).
    std::vector<int64_t> missing(static_cast<size_t>(nj + 1), 0);
    for (int64_t i = 0; i < nj; ++i)
      missing[static_cast<size_t>(i + 1)] =
          missing[static_cast<size_t>(i)] +
          (ids[static_cast<size_t>(g)][static_cast<size_t>(i)] == -1);
    for (int64_t j = 1; j <= nj; ++j) {
      const int64_t first = first_visible(g, j * bt) / bt;
      if (missing[static_cast<size_t>(j)] != missing[static_cast<size_t>(first)])
        ok[static_cast<size_t>(j)] = 0;
    }
  }
  int64_t j = nj;
  // Hybrid models: the linear layers need their state at the hit, which exists only where a
  // snapshot was taken: the latest such block boundary that every group can serve (none: no
  // hit, never a state that does not belong to the tokens).
  const auto usable = [&](int64_t n) {
    if (!ok[static_cast<size_t>(n)]) return false;
    return !linear_ || snaps_->contains(keys[0][static_cast<size_t>(n - 1)]);
  };
  while (j > 0 && !usable(j)) --j;
  hit.full = j * bt;
  if (linear_ && j > 0) hit.snapshot = keys[0][static_cast<size_t>(j - 1)];
  for (size_t g = 0; g < groups_.size(); ++g) {
    keys[g].resize(static_cast<size_t>(j));
    ids[g].resize(static_cast<size_t>(j));
  }
  // No tail: a partial block has no state; disk blocks are full ones.
  // Quantized pages: whole blocks only — a tail would have to be dequantized into the residual,
  // which then would not hold what the dense quantized container holds (full precision).
  if (linear_ || has_compressed() || with_disk || config_.quant) return hit;
  const auto head_len =
      std::min<int64_t>(bt - 1, static_cast<int64_t>(tokens.size()) - 1 - hit.full);
  if (mode == PrefixMatch::kFullBlocks || head_len <= 0) return hit;

  // The tail: per group, the cached child of block j - 1 sharing the most of the next tokens.
  const std::span<const int32_t> head =
      tokens.subspan(static_cast<size_t>(hit.full), static_cast<size_t>(head_len));
  int64_t tail = head_len;
  hit.tail_src.assign(groups_.size(), -1);
  for (size_t g = 0; g < groups_.size() && tail > 0; ++g) {
    int32_t matched = 0;
    hit.tail_src[g] = pools_[g]->longest_child(
        j == 0 ? BlockKey{} : keys[g][static_cast<size_t>(j - 1)], salt, head, matched);
    tail = std::min<int64_t>(tail, matched);
  }
  // attach_prefix takes the shared blocks (cached ones leave the free list), holds the source
  // and then allocates the copy: every group needs one block left after those.
  for (size_t g = 0; g < groups_.size() && tail > 0; ++g) {
    const BlockPool& pool = *pools_[g];
    const int64_t lo = first_visible(static_cast<int>(g), hit.full + tail);
    int32_t taken = pool.ref_count(hit.tail_src[g]) == 0;
    for (int64_t i = 0; i < j; ++i)
      if ((i + 1) * bt > lo && pool.ref_count(hit.blocks[g][static_cast<size_t>(i)]) == 0) ++taken;
    if (pool.num_available() - taken < 1) tail = 0;
  }
  hit.tail = tail;
  return hit;
}

int64_t PagedKVStore::match_prefix(std::span<const int32_t> tokens, std::span<const uint8_t> salt,
                                   PrefixMatch mode, const KVPolicy& policy) {
  if (has_compressed()) return 0;  // refused (attach_prefix counts it)
  const PrefixHit hit = find_prefix(tokens, keyed_salt(salt, policy), mode);
  return hit.full + hit.tail;
}

int64_t PagedKVStore::attach_prefix(SeqId seq, std::span<const int32_t> tokens, PrefixMatch mode) {
  if (step_open_) bad("attach_prefix during an unfinished step");
  Seq& s = seq_ref(seq);
  if (s.len != 0) bad("attach_prefix: sequence " + std::to_string(seq) + " is not empty");
  last_disk_tokens_ = 0;
  last_remote_tokens_ = 0;
  std::vector<uint8_t> from_disk;
  if (disk_ || staged_.blocks > 0) load_from_disk(tokens, s.salt, from_disk);
  clear_remote_stage();
  const PrefixHit hit = find_prefix(tokens, s.salt, mode);
  const int64_t m = hit.full + hit.tail, bt = config_.block_tokens;
  if (m == 0) return 0;
  for (int64_t i = 0; i < hit.full / bt && i < static_cast<int64_t>(from_disk.size()); ++i) {
    last_disk_tokens_ += from_disk[static_cast<size_t>(i)] == 1 ? bt : 0;
    last_remote_tokens_ += from_disk[static_cast<size_t>(i)] == 2 ? bt : 0;
  }
  if (has_compressed()) {
    // The compressors' buffers and overlaps at the hit are not kept: continuing from cached
    // blocks would fold windows from a zero state. Recompute instead (never a wrong
    // continuation) and count the refusal.
    ++prefix_refused_compressed_;
    return 0;
  }
  for (int g = 0; g < num_groups(); ++g) {
    BlockPool& pool = *pools_[static_cast<size_t>(g)];
    std::vector<int32_t>& table = s.tables[static_cast<size_t>(g)];
    const int64_t lo = first_visible(g, m);
    s.keys[static_cast<size_t>(g)] = hit.keys[static_cast<size_t>(g)];
    for (int64_t i = 0; i < hit.full / bt; ++i) {
      if ((i + 1) * bt <= lo) {  // out of the window: the null block
        pool.retain(0);
        table.push_back(0);
        continue;
      }
      const int32_t id = hit.blocks[static_cast<size_t>(g)][static_cast<size_t>(i)];
      KV_CHECK(id >= 0, "match_prefix promised this block");
      pool.acquire(id);
      table.push_back(id);
    }
    if (hit.tail > 0) {  // hold the source so the allocation cannot evict it, copy, let go
      const int32_t src = hit.tail_src[static_cast<size_t>(g)];
      pool.acquire(src);
      KV_CHECK(pool.allocate(1, table), "find_prefix counted a block for the tail");
      copy_block(g, src, table.back(), hit.tail);
      pool.release(src);
    }
  }
  if (slots_) {
    const float* snap = snaps_->get(hit.snapshot);
    KV_CHECK(snap != nullptr, "find_prefix promised a state snapshot");
    std::memcpy(slots_->slot_data(s.slot), snap, slots_->layout().slot_bytes());
  }
  s.tokens.assign(tokens.begin(), tokens.begin() + m);
  s.len = m;
  if (std::find(batch_.begin(), batch_.end(), seq) != batch_.end()) build_tables();
  return m;
}

int64_t PagedKVStore::match_prefix_with_disk(std::span<const int32_t> tokens,
                                             std::span<const uint8_t> salt,
                                             const KVPolicy& policy) {
  if (has_compressed()) return 0;
  return find_prefix(tokens, keyed_salt(salt, policy), PrefixMatch::kFullBlocks,
                     disk_ != nullptr || staged_.blocks > 0)
      .full;
}

bool PagedKVStore::staged(int g, int64_t i, const BlockKey& key) const {
  const auto gi = static_cast<size_t>(g);
  if (staged_.blocks == 0 || gi >= staged_.records.size() || i < staged_.first_block ||
      i >= staged_.first_block + staged_.blocks || staged_.records[gi].empty())
    return false;
  // The tier verified the record against the key it asked for.
  return block_record::record_key(
             staged_.records[gi][static_cast<size_t>(i - staged_.first_block)]) == key;
}

void PagedKVStore::set_remote_tier(std::shared_ptr<RemoteTier> remote) {
  if (remote) {
    const std::string why = state_outside_pages();
    if (!why.empty())
      bad("the remote tier shares the K/V pages of prefix blocks, but this model has " + why +
              ", which those pages do not carry: a remote hit could not continue exactly; serve "
              "it without --kv-remote",
          ErrorKind::kUnsupported);
    if (remote->options().block_tokens != config_.block_tokens)
      bad("remote tier block_tokens " + std::to_string(remote->options().block_tokens) +
          " != the store's " + std::to_string(config_.block_tokens));
  }
  if (remote_) {
    sinks_.erase(std::remove(sinks_.begin(), sinks_.end(),
                             std::static_pointer_cast<BlockEventSink>(remote_)),
                 sinks_.end());
    install_pool_hooks();
  }
  remote_ = std::move(remote);
  clear_remote_stage();
  if (remote_) add_event_sink(remote_);
}

std::vector<std::vector<BlockKey>> PagedKVStore::prefix_block_keys(
    std::span<const int32_t> tokens, std::span<const uint8_t> raw_salt, const KVPolicy& policy) {
  const std::vector<uint8_t> salt = keyed_salt(raw_salt, policy);
  std::vector<std::vector<BlockKey>> keys(groups_.size());
  if (tokens.size() <= 1) return keys;
  const int64_t bt = config_.block_tokens;
  const int64_t nj = static_cast<int64_t>(tokens.size() - 1) / bt;
  for (int g = 0; g < num_groups(); ++g) {
    if (groups_[static_cast<size_t>(g)].kind == GroupKind::kCompressed) continue;
    BlockKey parent;
    for (int64_t i = 0; i < nj; ++i) {
      parent = block_key(parent, g, salt,
                         tokens.subspan(static_cast<size_t>(i * bt), static_cast<size_t>(bt)));
      keys[static_cast<size_t>(g)].push_back(parent);
    }
  }
  return keys;
}

size_t PagedKVStore::block_payload_bytes(int g) const {
  return paged_block_bytes(config_, groups_[static_cast<size_t>(g)]);
}

void PagedKVStore::stage_remote(RemoteResult result) {
  staged_ = std::move(result);
  if (staged_.records.size() != groups_.size()) staged_ = RemoteResult{};
}

const char* block_source_name(BlockSource s) {
  switch (s) {
    case BlockSource::kComputed:
      return "computed";
    case BlockSource::kDisk:
      return "disk";
    case BlockSource::kRemote:
      return "remote";
    case BlockSource::kSession:
      return "session";
  }
  return "?";
}

void PagedKVStore::install_pool_hooks() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    const int gi = static_cast<int>(g);
    pools_[g]->set_key_drop_hook([this, gi](const BlockKey& key) {
      // A snapshot is keyed by group 0's block ending at its position: it goes when that key
      // goes (eviction), so no snapshot outlives the blocks a hit needs with it.
      if (gi == 0 && snaps_) snaps_->drop_with_block(key);
      if (clearing_) return;
      for (const auto& sink : sinks_) sink->on_removed(gi, key);
    });
    if (sinks_.empty()) {
      pools_[g]->set_commit_hook(nullptr);
      continue;
    }
    pools_[g]->set_commit_hook([this, gi](int32_t id, const BlockKey& key, const BlockKey& parent,
                                          std::span<const int32_t> tok) {
      const std::vector<std::span<std::byte>> pages = block_pages(gi, id);
      StoredBlock b;
      b.group = gi;
      b.id = id;
      b.key = key;
      b.parent = parent;
      b.tokens = tok;
      b.source = commit_source_;
      b.pages = pages;
      for (const auto& sink : sinks_) sink->on_stored(b);
    });
  }
}

void PagedKVStore::add_event_sink(std::shared_ptr<BlockEventSink> sink) {
  if (!sink) bad("add_event_sink: null sink");
  sinks_.push_back(std::move(sink));
  install_pool_hooks();
}

void PagedKVStore::clear_prefix_cache() {
  clearing_ = true;
  for (auto& pool : pools_) pool->clear_index();
  clearing_ = false;
  for (const auto& sink : sinks_) sink->on_cleared();
}

std::string PagedKVStore::state_outside_pages() const {
  if (linear_) return "linear-attention layers (their recurrent state at a block boundary)";
  if (has_compressed())
    return "compressed (CSA/HCA) layers (their compressors' state at a block boundary)";
  for (const std::string& t : config_.layer_types)
    if (is_indexed_layer_type(t)) return "indexed (DSA) layers (their indexer keys)";
  return "";
}

void PagedKVStore::set_disk_tier(std::shared_ptr<DiskTier> disk) {
  if (disk) {
    const std::string why = state_outside_pages();
    if (!why.empty())
      bad("the disk tier stores the K/V pages of evicted prefix blocks, but this model has " + why +
              ", which those pages do not carry: a disk hit could not continue exactly; serve it "
              "without --kv-disk",
          ErrorKind::kUnsupported);
    if (disk->options().block_tokens != config_.block_tokens)
      bad("disk tier block_tokens " + std::to_string(disk->options().block_tokens) +
          " != the store's " + std::to_string(config_.block_tokens));
  }
  disk_ = std::move(disk);
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (!disk_) {
      pools_[g]->set_evict_hook(nullptr);
      continue;
    }
    const int gi = static_cast<int>(g);
    pools_[g]->set_evict_hook(
        [this, gi](int32_t id, const BlockKey& key, const BlockKey& parent,
                   std::span<const int32_t> tok) { write_behind(gi, id, key, parent, tok); });
  }
}

Digest128 PagedKVStore::layout_digest() const {
  if (!allocated()) bad("layout_digest: the pages do not exist yet (kv_heads, head_dim unknown)");
  Hasher h;
  h.str("kvcache paged layout v1").str(dtype_name(config_.dtype)).i64(config_.block_tokens);
  h.i64(config_.kv_heads).i64(config_.head_dim).i64(config_.head_dim_v);
  h.i64(config_.sliding_window).u32(config_.shared_kv ? 1 : 0);
  h.i64(static_cast<int64_t>(config_.layer_types.size()));
  for (size_t l = 0; l < config_.layer_types.size(); ++l) {
    const int li = static_cast<int>(l);
    h.str(config_.layer_types[l]).i64(layer_group_[l]);
    h.u32(paged_layer_owns_pages(config_, li) ? 1 : 0).u32(paged_layer_k_only(config_, li) ? 1 : 0);
  }
  for (const PagedGroup& g : groups_)
    h.u32(static_cast<uint32_t>(g.kind)).i64(g.window).i64(g.rate);
  if (config_.quant)  // packed pages: a tier never mixes formats (unquantized digests unchanged)
    h.str("quantized")
        .u32(static_cast<uint32_t>(config_.quant->scheme))
        .u32(static_cast<uint32_t>(config_.quant->bits))
        .i64(qfmt_.v_group);
  return h.finish();
}

int64_t PagedKVStore::spill_to_disk() {
  if (!disk_) return 0;
  int64_t written = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const BlockPool& pool = *pools_[g];
    for (int32_t id = 0; id < pool.num_blocks(); ++id) {
      if (!pool.is_keyed(id) || disk_->contains(pool.key(id), static_cast<int32_t>(g))) continue;
      const auto write = [&] {
        return write_behind(static_cast<int>(g), id, pool.key(id), pool.parent(id),
                            pool.tokens(id));
      };
      bool ok = write();
      if (!ok) {  // too much in flight: wait for it, then once more
        disk_->flush();
        ok = write();
      }
      written += ok;
    }
  }
  disk_->flush();
  return written;
}

std::vector<std::span<std::byte>> PagedKVStore::block_pages(int g, int32_t id) {
  std::vector<std::span<std::byte>> pages;
  for (const int l : groups_[static_cast<size_t>(g)].layers) {
    if (!paged_layer_owns_pages(config_, l)) continue;
    if (config_.quant) {  // the packed K then V bytes of the block, every head
      const auto li = static_cast<size_t>(l);
      const auto kb = static_cast<size_t>(config_.kv_heads * kbb_),
                 vb = static_cast<size_t>(config_.kv_heads * vbb_);
      pages.emplace_back(kq_[li].data() + static_cast<size_t>(id) * kb, kb);
      pages.emplace_back(vq_[li].data() + static_cast<size_t>(id) * vb, vb);
      continue;
    }
    for (Tensor* t : {&k_pages_[static_cast<size_t>(l)], &v_pages_[static_cast<size_t>(l)]}) {
      if (!t->defined() || t->size_bytes() == 0) continue;  // K==V: no V pages
      const size_t page = t->size_bytes() / static_cast<size_t>(t->view().dim(0));
      pages.emplace_back(static_cast<std::byte*>(t->data()) + static_cast<size_t>(id) * page, page);
    }
  }
  return pages;
}

bool PagedKVStore::write_behind(int g, int32_t id, const BlockKey& key, const BlockKey& parent,
                                std::span<const int32_t> tokens) {
  const std::vector<std::span<std::byte>> pages = block_pages(g, id);
  const std::vector<std::span<const std::byte>> parts(pages.begin(), pages.end());
  return disk_->store(key, parent, g, tokens, parts);
}

void PagedKVStore::load_from_disk(std::span<const int32_t> tokens, std::span<const uint8_t> salt,
                                  std::vector<uint8_t>& loaded) {
  const PrefixHit hit = find_prefix(tokens, salt, PrefixMatch::kFullBlocks, true);
  const int64_t bt = config_.block_tokens, j = hit.full / bt;
  loaded.assign(static_cast<size_t>(j), 0);
  // The RAM blocks the hit sees are held first, so that allocating blocks for the loads cannot
  // evict them; everything held is let go at the end, last blocks first (the prefix then sits
  // at the most recent end of the LRU), and the RAM match finds it all cached.
  std::vector<std::vector<std::pair<int64_t, int32_t>>> held(groups_.size());  // (index, id)
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].kind == GroupKind::kCompressed) continue;
    const int64_t lo = first_visible(static_cast<int>(g), j * bt);
    for (int64_t i = 0; i < j; ++i) {
      const int32_t id = hit.blocks[g][static_cast<size_t>(i)];
      if ((i + 1) * bt > lo && id >= 0) {
        pools_[g]->acquire(id);
        held[g].emplace_back(i, id);
      }
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (groups_[g].kind == GroupKind::kCompressed) continue;
    BlockPool& pool = *pools_[g];
    const int64_t lo = first_visible(static_cast<int>(g), j * bt);
    const size_t bytes = paged_block_bytes(config_, groups_[g]);
    if (load_buf_.size() < bytes) load_buf_.resize(bytes);
    // Readahead for every file of the hit first, so that the kernel reads them while the loads
    // below verify and copy the earlier ones (a cold page cache).
    for (int64_t i = 0; i < j; ++i)
      if ((i + 1) * bt > lo && hit.blocks[g][static_cast<size_t>(i)] == kOnDisk)
        disk_->prefetch(hit.keys[g][static_cast<size_t>(i)], static_cast<int32_t>(g));
    for (int64_t i = 0; i < j; ++i) {
      const int32_t where = hit.blocks[g][static_cast<size_t>(i)];
      if ((i + 1) * bt <= lo || (where != kOnDisk && where != kOnRemote)) continue;
      const bool remote = where == kOnRemote;
      const std::span<const int32_t> tok =
          tokens.subspan(static_cast<size_t>(i * bt), static_cast<size_t>(bt));
      const BlockKey& key = hit.keys[g][static_cast<size_t>(i)];
      std::vector<int32_t> fresh;
      const std::span<std::byte> payload(load_buf_.data(), bytes);
      // No block left, or a file that fails its checks: the hit ends before this block.
      if (!pool.allocate(1, fresh)) {
        ++(remote ? remote_load_failed_ : disk_load_failed_);
        break;
      }
      // A remote block was verified by the tier (its record in staged_); a disk one is read
      // and verified now.
      std::span<const std::byte> src = payload;
      if (remote) {
        src = staged_.payload(g, static_cast<size_t>(i - staged_.first_block));
        if (src.size() != bytes) {
          ++remote_load_failed_;
          pool.release(fresh[0]);
          break;
        }
      } else if (!disk_->load(key, static_cast<int32_t>(g), tok, payload)) {
        ++disk_load_failed_;
        pool.release(fresh[0]);  // unkeyed: back to the free end
        break;
      }
      size_t off = 0;
      for (const std::span<std::byte> p : block_pages(static_cast<int>(g), fresh[0])) {
        std::memcpy(p.data(), src.data() + off, p.size());
        off += p.size();
      }
      KV_CHECK(off == bytes, "tier block payload size != the block's pages");
      set_commit_source(remote ? BlockSource::kRemote : BlockSource::kDisk);
      pool.commit(fresh[0], key, i == 0 ? BlockKey{} : hit.keys[g][static_cast<size_t>(i - 1)],
                  tok);
      set_commit_source(BlockSource::kComputed);
      held[g].emplace_back(i, fresh[0]);
      uint8_t& mark = loaded[static_cast<size_t>(i)];
      if (remote) {
        mark = mark == 0 ? 2 : mark;
        ++remote_loaded_;
      } else {
        mark = 1;
        ++disk_loaded_;
      }
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::sort(held[g].begin(), held[g].end());
    for (auto it = held[g].rbegin(); it != held[g].rend(); ++it) pools_[g]->release(it->second);
  }
}

void PagedKVStore::copy_block(int g, int32_t src, int32_t dst, int64_t slots) {
  const bool entries = groups_[static_cast<size_t>(g)].kind == GroupKind::kCompressed;
  for (const int l : groups_[static_cast<size_t>(g)].layers) {
    const auto li = static_cast<size_t>(l);
    const std::vector<Tensor*> all =
        entries ? std::vector<Tensor*>{&c_pages_[li], &x_pages_[li]}
                : std::vector<Tensor*>{&k_pages_[li], &v_pages_[li], &x_pages_[li]};
    for (Tensor* pages : all) {
      if (!pages->defined() || pages->size_bytes() == 0) continue;
      const TensorView p = pages->view();
      const size_t n = dtype_bytes(config_.dtype, slots * p.dim(3));  // K and V widths may differ
      for (int64_t h = 0; h < p.dim(1); ++h) std::memcpy(p.ptr(dst, h, 0), p.ptr(src, h, 0), n);
    }
  }
}

bool PagedKVStore::fork(SeqId seq, int n, std::vector<SeqId>& children) {
  if (step_open_) bad("fork during an unfinished step");
  if (n < 0) bad("fork: n must be >= 0");
  const int64_t bt = config_.block_tokens, len = seq_ref(seq).len;
  for (int g = 0; g < num_groups(); ++g)
    if (group_slots(g, len) % bt != 0 && pools_[static_cast<size_t>(g)]->num_available() < n)
      return false;
  if (slots_ && slots_->num_free() < n) return false;
  if (config_.quant && static_cast<int64_t>(qfree_.size()) < n) return false;
  for (int c = 0; c < n; ++c) {
    const SeqId child = new_sequence(seq_ref(seq).salt);  // may reallocate seqs_
    const Seq& s = seq_ref(seq);
    Seq& d = seq_ref(child);
    d.len = s.len;
    d.policy = s.policy;
    d.evicted = s.evicted;
    d.tokens_known = s.tokens_known;
    d.tokens = s.tokens;
    d.keys = s.keys;
    if (slots_) slots_->copy(s.slot, d.slot);
    if (config_.quant) copy_slot(s.qslot, d.qslot, len % bt);  // the residual
    for (int g = 0; g < num_groups(); ++g) {
      BlockPool& pool = *pools_[static_cast<size_t>(g)];
      const std::vector<int32_t>& src = s.tables[static_cast<size_t>(g)];
      std::vector<int32_t>& dst = d.tables[static_cast<size_t>(g)];
      const int64_t partial = group_slots(g, len) % bt;
      const size_t shared = partial == 0 ? src.size() : src.size() - 1;
      for (size_t i = 0; i < shared; ++i) {
        pool.retain(src[i]);
        dst.push_back(src[i]);
      }
      if (partial != 0) {
        KV_CHECK(pool.allocate(1, dst), "blocks checked above");
        if (!config_.quant) copy_block(g, src.back(), dst.back(), partial);  // else: in the slot
      }
    }
    children.push_back(child);
  }
  return true;
}

void PagedKVStore::set_rollback_tokens(int64_t tokens) {
  if (tokens < 0)
    bad("set_rollback_tokens: " + std::to_string(tokens) + " tokens; give 0 or more",
        ErrorKind::kInvalidArgument);
  rollback_tokens_ = tokens;
}

void PagedKVStore::crop(int64_t n) {
  if (step_open_) bad("crop during an unfinished step");
  const int64_t bt = config_.block_tokens;
  std::vector<int64_t> target(batch_.size());
  std::vector<int64_t> copies(groups_.size(), 0);
  for (size_t b = 0; b < batch_.size(); ++b) {  // validate everything first
    const Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    target[b] = crop_target_length(n, s.len);  // crop(0) keeps everything (the speculative case)
    if (target[b] == s.len) continue;
    if (slots_ && target[b] != 0)
      bad("crop to " + std::to_string(target[b]) + " of " + std::to_string(s.len) +
              " tokens: the linear-attention or compressor state cannot go back (the paged "
              "store keeps no per-token history); crop to 0 or keep the length, or use the "
              "dynamic cache",
          ErrorKind::kUnsupported);
    for (int g = 0; g < num_groups(); ++g) {
      const std::vector<int32_t>& t = s.tables[static_cast<size_t>(g)];
      for (int64_t i = first_visible(g, s, target[b]) / bt; i < ceil_div(target[b], bt); ++i)
        if (is_null(g, t[static_cast<size_t>(i)]))
          bad("crop to " + std::to_string(target[b]) + " tokens: the " +
                  (streams(g, s) ? "streaming policy (" + s.policy.key() + ")"
                                 : std::string("sliding window")) +
                  " already dropped the keys those positions need",
              ErrorKind::kOutOfRange);
      if (target[b] % bt != 0 &&
          pools_[static_cast<size_t>(g)]->ref_count(t[static_cast<size_t>(target[b] / bt)]) > 1)
        ++copies[static_cast<size_t>(g)];
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    if (copies[g] > pools_[g]->num_available())
      bad("crop: no free block to copy a shared block into", ErrorKind::kOutOfRange);
  for (size_t b = 0; b < batch_.size(); ++b) {
    Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    if (target[b] == s.len) continue;
    const int64_t keep_blocks = ceil_div(target[b], bt);
    for (int g = 0; g < num_groups(); ++g) {
      BlockPool& pool = *pools_[static_cast<size_t>(g)];
      std::vector<int32_t>& t = s.tables[static_cast<size_t>(g)];
      // Quantized pages: a cut inside a full (packed) block dequantizes its kept tokens back
      // into the residual, as the dense container's crop does; a cut inside the residual
      // just shortens it.
      if (config_.quant && target[b] % bt != 0 && target[b] / bt < s.len / bt)
        dequantize_into_slot(g, t[static_cast<size_t>(target[b] / bt)], target[b] % bt, s.qslot);
      pool.release_table(std::span<const int32_t>(t).subspan(static_cast<size_t>(keep_blocks)));
      t.resize(static_cast<size_t>(keep_blocks));
      if (target[b] % bt != 0) {  // the new last block is partial: written next, so private
        const int32_t last = t.back();
        if (pool.ref_count(last) > 1) {
          std::vector<int32_t> fresh;
          KV_CHECK(pool.allocate(1, fresh), "blocks checked above");
          if (!config_.quant) copy_block(g, last, fresh[0], target[b] % bt);
          pool.release(last);
          t.back() = fresh[0];
        } else {
          pool.forget(last);
        }
      }
      std::vector<BlockKey>& keys = s.keys[static_cast<size_t>(g)];
      keys.resize(std::min(keys.size(), static_cast<size_t>(target[b] / bt)));
    }
    if (s.tokens_known) s.tokens.resize(static_cast<size_t>(target[b]));
    s.len = target[b];
    if (s.len == 0) {  // nothing computed under eviction is left: keyed again from here
      s.evicted = 0;
      s.tokens_known = true;
      s.tokens.clear();
    }
    if (slots_) {  // target 0 (checked above): the zero state
      slots_->zero(s.slot);
      s.state_lost = false;
    }
  }
  build_tables();
}

void PagedKVStore::reset() {
  for (Seq& s : seqs_)
    if (s.live) drop_seq(s);
  batch_.clear();
  step_open_ = false;
  build_tables();
}

void PagedKVStore::reorder(std::span<const int64_t> beam_idx) {
  if (beam_idx.size() != batch_.size())
    throw Error(ErrorKind::kInvalidArgument, "reorder: " + std::to_string(beam_idx.size()) +
                                                 " indices for a batch of " +
                                                 std::to_string(batch_.size()));
  remap(beam_idx);
}

void PagedKVStore::repeat_interleave(int64_t r) {
  if (r < 1) throw Error(ErrorKind::kInvalidArgument, "repeat_interleave: r must be >= 1");
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < static_cast<int64_t>(batch_.size()); ++b)
    for (int64_t i = 0; i < r; ++i) rows.push_back(b);
  remap(rows);
}

void PagedKVStore::remap(std::span<const int64_t> rows) {
  if (step_open_) bad("reorder/select during an unfinished step");
  const auto B = static_cast<int64_t>(batch_.size());
  std::vector<int> uses(batch_.size(), 0);
  for (const int64_t r : rows) {
    if (r < 0 || r >= B)
      bad("row index " + std::to_string(r) + " outside the batch of " + std::to_string(B));
    ++uses[static_cast<size_t>(r)];
  }
  const int64_t bt = config_.block_tokens;
  for (int g = 0; g < num_groups(); ++g) {
    int64_t copies = 0;
    for (size_t r = 0; r < batch_.size(); ++r)
      if (uses[r] > 1 && group_slots(g, seqs_[static_cast<size_t>(batch_[r])].len) % bt != 0)
        copies += uses[r] - 1;
    if (copies > pools_[static_cast<size_t>(g)]->num_available())
      bad("out of blocks for the partial blocks of " + std::to_string(copies) + " copied rows",
          ErrorKind::kOutOfRange);
  }
  if (slots_) {
    int64_t forks = 0;
    for (const int u : uses) forks += std::max(0, u - 1);
    if (forks > slots_->num_free())
      bad("out of linear-attention state slots for " + std::to_string(forks) + " repeated rows (" +
              std::to_string(slots_->num_free()) + " free)",
          ErrorKind::kOutOfRange);
  }
  if (config_.quant) {
    int64_t forks = 0;
    for (const int u : uses) forks += std::max(0, u - 1);
    if (forks > static_cast<int64_t>(qfree_.size()))
      bad("out of residual slots of the quantized pages for " + std::to_string(forks) +
              " repeated rows (" + std::to_string(qfree_.size()) + " free)",
          ErrorKind::kOutOfRange);
  }
  const std::vector<SeqId> old = batch_;
  std::vector<SeqId> next;
  std::vector<uint8_t> taken(old.size(), 0);
  for (const int64_t r : rows) {
    const SeqId src = old[static_cast<size_t>(r)];
    if (!taken[static_cast<size_t>(r)]) {
      taken[static_cast<size_t>(r)] = 1;
      next.push_back(src);
    } else {
      std::vector<SeqId> child;
      KV_CHECK(fork(src, 1, child), "blocks checked above");
      next.push_back(child[0]);
    }
  }
  batch_ = next;
  for (size_t r = 0; r < old.size(); ++r)
    if (!taken[r]) drop_seq(seqs_[static_cast<size_t>(old[r])]);
  build_tables();
}

PagedGroupStats PagedKVStore::stats(int g) const {
  PagedGroupStats st;
  st.pool = pools_[static_cast<size_t>(g)]->stats();
  PagedStoreConfig c = config_;
  st.block_bytes = paged_block_bytes(c, groups_[static_cast<size_t>(g)]);
  st.used_bytes = static_cast<size_t>(st.pool.used) * st.block_bytes;
  const int64_t bt = config_.block_tokens;
  for (const Seq& s : seqs_) {
    if (!s.live) continue;
    const std::vector<int32_t>& t = s.tables[static_cast<size_t>(g)];
    const int64_t n = group_slots(g, s.len);  // entries for compressed groups
    for (size_t i = 0; i < t.size(); ++i) {
      if (is_null(g, t[i])) continue;
      st.allocated_slots += bt;
      st.live_tokens += std::min<int64_t>(bt, n - static_cast<int64_t>(i) * bt);
    }
  }
  return st;
}

size_t PagedKVStore::used_bytes() const {
  size_t total = 0;
  for (int g = 0; g < num_groups(); ++g) total += stats(g).used_bytes;
  return total;
}

size_t PagedKVStore::layer_page_bytes(int layer) const {
  const auto l = static_cast<size_t>(layer);
  size_t q = 0;
  if (l < kq_.size()) q = kq_[l].size() + vq_[l].size();
  return k_pages_[l].size_bytes() + v_pages_[l].size_bytes() + c_pages_[l].size_bytes() +
         x_pages_[l].size_bytes() + q;
}

size_t PagedKVStore::pool_bytes() const {
  size_t total = 0;
  for (size_t l = 0; l < k_pages_.size(); ++l) total += layer_page_bytes(static_cast<int>(l));
  for (const auto& pool : pools_) total += pool->bytes();
  return total;
}

size_t PagedKVStore::linear_state_bytes() const {
  if (!slots_) return 0;
  return slots_->bytes() + conv_prev_ws_.size_bytes() + conv_ws_.size_bytes() +
         rec_ws_.size_bytes();
}

size_t PagedKVStore::snapshot_bytes() const {
  return snaps_ ? snaps_->bytes() : 0;
}

size_t PagedKVStore::layer_state_bytes(int layer) const {
  const auto l = static_cast<size_t>(layer);
  if (l < rk_.size())  // quantized pages: this layer's residual slots and step workspace
    return rk_[l].size_bytes() + rv_[l].size_bytes() + wk_[l].size_bytes() + wv_[l].size_bytes();
  const std::string& type = config_.layer_types[static_cast<size_t>(layer)];
  if (is_compressed_layer_type(type))  // its compressors' state in every slot
    return static_cast<size_t>(layer_compressor_elems(config_, type)) * sizeof(float) *
           static_cast<size_t>(slots_->num_slots());
  if (linear_index(layer) < 0) return 0;
  const auto per = static_cast<size_t>(slots_->layout().layer_elems()) * sizeof(float);
  return per * static_cast<size_t>(slots_->num_slots() + snaps_->capacity());
}

size_t PagedKVStore::leader_extra_bytes() const {
  size_t own = 0;
  for (int l = 0; l < static_cast<int>(config_.layer_types.size()); ++l)
    own += layer_page_bytes(l) + layer_state_bytes(l);
  return bytes() - own;
}

size_t PagedKVStore::bytes() const {
  size_t total = pool_bytes() + linear_state_bytes() + snapshot_bytes() + quant_state_bytes() +
                 seqs_.capacity() * sizeof(Seq) + batch_.capacity() * sizeof(SeqId) +
                 step_base_.capacity() * sizeof(int64_t) + ws_off_.capacity() * sizeof(int64_t) +
                 qfree_.capacity() * sizeof(int32_t);
  for (size_t l = 0; l < qrows_.size(); ++l)
    total += qrows_[l].capacity() * sizeof(QuantKV) + qoff_[l].capacity() * sizeof(int64_t);
  for (const Seq& s : seqs_) {
    total += s.tokens.capacity() * sizeof(int32_t) + s.salt.capacity();
    for (const auto& t : s.tables) total += t.capacity() * sizeof(int32_t);
    for (const auto& k : s.keys) total += k.capacity() * sizeof(BlockKey);
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    total += (indptr_[g].capacity() + indices_[g].capacity() + last_len_[g].capacity()) *
             sizeof(int32_t);
  for (const auto& r : row_off_) total += r.capacity() * sizeof(int64_t);
  return total;
}

std::string PagedKVStore::check_invariants() const {
  if (config_.quant) {  // residual slots: one per live sequence, the others free
    const int32_t n = paged_sequence_slots(config_);
    std::vector<uint8_t> seen(static_cast<size_t>(n), 0);
    int32_t live = 0;
    for (const int32_t f : qfree_) {
      if (f < 0 || f >= n || seen[static_cast<size_t>(f)]++)
        return "residual slot " + std::to_string(f) + " free twice or out of range";
    }
    for (size_t id = 0; id < seqs_.size(); ++id) {
      const Seq& s = seqs_[id];
      if (!s.live) continue;
      ++live;
      if (s.qslot < 0 || s.qslot >= n || seen[static_cast<size_t>(s.qslot)]++)
        return "sequence " + std::to_string(id) + ": residual slot " + std::to_string(s.qslot) +
               " missing, free or held twice";
    }
    if (live + static_cast<int32_t>(qfree_.size()) != n)
      return "residual slots: " + std::to_string(live) + " live sequences + " +
             std::to_string(qfree_.size()) + " free != " + std::to_string(n);
  }
  if (slots_) {
    int32_t live = 0;
    std::vector<uint8_t> seen(static_cast<size_t>(slots_->num_slots()), 0);
    for (size_t id = 0; id < seqs_.size(); ++id) {
      const Seq& s = seqs_[id];
      if (!s.live) continue;
      ++live;
      if (!slots_->in_use(s.slot) || seen[static_cast<size_t>(s.slot)]++)
        return "sequence " + std::to_string(id) + ": linear state slot " + std::to_string(s.slot) +
               " not in use or held twice";
    }
    if (live + slots_->num_free() != slots_->num_slots())
      return "linear state slots: " + std::to_string(live) + " live sequences + " +
             std::to_string(slots_->num_free()) + " free != " + std::to_string(slots_->num_slots());
  }
  for (int g = 0; g < num_groups(); ++g) {
    const BlockPool& pool = *pools_[static_cast<size_t>(g)];
    std::string e = pool.check_invariants();
    if (!e.empty()) return "group " + std::to_string(g) + ": " + e;
    std::vector<int32_t> refs(static_cast<size_t>(pool.num_blocks()), 0);
    if (has_null_block(g)) refs[0] = 1;  // the store's hold
    for (size_t id = 0; id < seqs_.size(); ++id) {
      const Seq& s = seqs_[id];
      if (!s.live) continue;
      const std::vector<int32_t>& t = s.tables[static_cast<size_t>(g)];
      if (static_cast<int64_t>(t.size()) != group_blocks_for(g, s.len))
        return "sequence " + std::to_string(id) + ": " + std::to_string(t.size()) + " blocks for " +
               std::to_string(s.len) + " tokens";
      for (const int32_t b : t) {
        if (b < 0 || b >= pool.num_blocks())
          return "sequence " + std::to_string(id) + ": bad block id";
        ++refs[static_cast<size_t>(b)];
      }
      if (s.tokens_known && static_cast<int64_t>(s.tokens.size()) != s.len)
        return "sequence " + std::to_string(id) + ": token ids out of step with its length";
    }
    for (int32_t b = 0; b < pool.num_blocks(); ++b)
      if (pool.ref_count(b) != refs[static_cast<size_t>(b)])
        return "group " + std::to_string(g) + " block " + std::to_string(b) + ": ref count " +
               std::to_string(pool.ref_count(b)) + " but " +
               std::to_string(refs[static_cast<size_t>(b)]) + " table entries";
  }
  return {};
}

int PagedKVStore::linear_index(int layer) const {
  if (layer < 0 || layer >= static_cast<int>(linear_index_.size())) return -1;
  return linear_index_[static_cast<size_t>(layer)];
}

void PagedKVStore::check_linear_call(int layer, const char* what) const {
  if (linear_index(layer) < 0)
    bad(std::string(what) + ": layer " + std::to_string(layer) +
        " is not a linear_attention layer");
}

bool PagedKVStore::batch_slots_consecutive() const {
  for (size_t b = 1; b < batch_.size(); ++b)
    if (seqs_[static_cast<size_t>(batch_[b])].slot !=
        seqs_[static_cast<size_t>(batch_[0])].slot + static_cast<int32_t>(b))
      return false;
  return true;
}

// Layer li's states of `rows` consecutive slots from the batch's first one, as one view.
TensorView PagedKVStore::slot_view(int li, bool recurrent, int64_t rows) const {
  const LinearStateShape& ls = config_.linear;
  const int64_t se = slots_->layout().slot_elems();
  float* base =
      const_cast<LinearStateSlots&>(*slots_).conv(seqs_[static_cast<size_t>(batch_[0])].slot, li);
  if (!recurrent)
    return TensorView(base, DType::kF32, {rows, ls.conv_kernel - 1, ls.conv_dim},
                      Dims{se, ls.conv_dim, 1, 0});
  return TensorView(base + slots_->layout().conv_elems(), DType::kF32,
                    {rows, ls.heads_v, ls.head_dim_k, ls.head_dim_v},
                    Dims{se, ls.head_dim_k * ls.head_dim_v, ls.head_dim_v, 1});
}

ConvStateUpdate PagedKVStore::linear_conv_update(int layer, const TensorView& x) {
  check_linear_call(layer, "update_conv_state");
  const LinearStateShape& ls = config_.linear;
  const std::string where = "layer " + std::to_string(layer) + " (paged/linear_attention): ";
  if (x.ndim() != 3 || x.dim(2) != ls.conv_dim || x.dim(1) < 1 || x.dim(0) < 1 ||
      !dtype_is_float(x.dtype()))
    bad(where + "update_conv_state(x): x must be the new conv inputs [B, T, " +
        std::to_string(ls.conv_dim) + "] (B, T >= 1, f32, f16 or bf16); got " + x.shape().str() +
        " " + dtype_name(x.dtype()));
  if (x.dim(0) > slots_->num_slots())
    bad(where + "update_conv_state: batch " + std::to_string(x.dim(0)) + " but the store has " +
            std::to_string(slots_->num_slots()) + " linear state slots",
        ErrorKind::kOutOfRange);
  open_step_if_needed(where, x.dim(0), x.dim(1));
  if (step_wrote_[static_cast<size_t>(layer)]) bad(where + "updated twice in one step");
  const int li = linear_index(layer);
  const int64_t B = x.dim(0), T = x.dim(1), w = ls.conv_kernel - 1, C = ls.conv_dim;
  ConvStateUpdate out;
  out.previous = conv_prev_ws_.view().slice(0, 0, B);
  for (int64_t b = 0; b < B; ++b) {
    float* win = slots_->conv(seqs_[static_cast<size_t>(batch_[static_cast<size_t>(b)])].slot, li);
    const TensorView stored(win, DType::kF32, {w, C});
    const TensorView prev = out.previous.slice(0, b, b + 1);
    const TensorView prev2(prev.data(), DType::kF32, {w, C});
    copy_view(stored, prev2);
    const int64_t keep = std::max<int64_t>(0, w - T);  // rows of the old window that stay
    if (keep > 0) copy_view(prev2.slice(0, w - keep, w), stored.slice(0, 0, keep));
    if (w - keep > 0) {
      const TensorView xb(x.ptr(b, T - (w - keep), 0), x.dtype(), {w - keep, C},
                          Dims{x.stride(1), x.stride(2), 0, 0});
      copy_view(xb, stored.slice(0, keep, w));
    }
  }
  out.state = linear_conv_state(layer);
  return out;
}

TensorView PagedKVStore::linear_conv_state(int layer) {
  check_linear_call(layer, "conv_state");
  if (batch_.empty()) bad("conv_state: the batch is empty (no update yet)");
  const auto B = static_cast<int64_t>(batch_.size());
  if (batch_slots_consecutive()) return slot_view(linear_index(layer), false, B);
  const TensorView ws = conv_ws_.view().slice(0, 0, B);
  const int64_t n = slots_->layout().conv_elems();
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(ws.ptr(b),
                slots_->conv(seqs_[static_cast<size_t>(batch_[b])].slot, linear_index(layer)),
                static_cast<size_t>(n) * sizeof(float));
  return ws;
}

TensorView PagedKVStore::linear_recurrent_state(int layer) {
  check_linear_call(layer, "recurrent_state");
  if (batch_.empty()) bad("recurrent_state: the batch is empty (no update yet)");
  const auto B = static_cast<int64_t>(batch_.size());
  if (batch_slots_consecutive()) return slot_view(linear_index(layer), true, B);
  const TensorView ws = rec_ws_.view().slice(0, 0, B);
  const int64_t n = slots_->layout().rec_elems();
  for (int64_t b = 0; b < B; ++b)
    std::memcpy(ws.ptr(b),
                slots_->rec(seqs_[static_cast<size_t>(batch_[b])].slot, linear_index(layer)),
                static_cast<size_t>(n) * sizeof(float));
  return ws;
}

TensorView PagedKVStore::linear_recurrent_update(int layer, const TensorView& st) {
  check_linear_call(layer, "update_recurrent_state");
  const LinearStateShape& ls = config_.linear;
  const std::string where = "layer " + std::to_string(layer) + " (paged/linear_attention): ";
  if (st.ndim() != 4 || st.dim(1) != ls.heads_v || st.dim(2) != ls.head_dim_k ||
      st.dim(3) != ls.head_dim_v || !dtype_is_float(st.dtype()))
    bad(where + "update_recurrent_state(state): state must be [B, " + std::to_string(ls.heads_v) +
        ", " + std::to_string(ls.head_dim_k) + ", " + std::to_string(ls.head_dim_v) +
        "] (f32, f16 or bf16); got " + st.shape().str() + " " + dtype_name(st.dtype()));
  if (st.dim(0) > slots_->num_slots())
    bad(where + "update_recurrent_state: batch " + std::to_string(st.dim(0)) +
            " but the store has " + std::to_string(slots_->num_slots()) + " linear state slots",
        ErrorKind::kOutOfRange);
  open_step_if_needed(where, st.dim(0), step_open_ ? step_tokens_ : 1);
  if (step_wrote_[static_cast<size_t>(layer)]) bad(where + "updated twice in one step");
  const int li = linear_index(layer);
  const auto B = static_cast<int64_t>(batch_.size());
  const bool direct = batch_slots_consecutive();
  const TensorView stored = direct ? slot_view(li, true, B) : rec_ws_.view().slice(0, 0, B);
  const bool same =
      st.data() == stored.data() && st.dtype() == DType::kF32 && st.strides() == stored.strides();
  if (!same) {
    const auto* p = static_cast<const std::byte*>(st.data());
    const auto* lo = static_cast<const std::byte*>(rec_ws_.data());
    const bool in_ws = p >= lo && p < lo + rec_ws_.size_bytes();
    if (in_ws && !direct && p != lo)
      bad(where +
          "update_recurrent_state(state): state overlaps the workspace without being "
          "it; pass recurrent_state() itself or a separate tensor");
    if (!in_ws || direct) copy_view(st, stored);
  }
  if (!direct) {  // scatter the batch rows back into their slots
    const int64_t n = slots_->layout().rec_elems();
    for (int64_t b = 0; b < B; ++b)
      std::memcpy(slots_->rec(seqs_[static_cast<size_t>(batch_[b])].slot, li), stored.ptr(b),
                  static_cast<size_t>(n) * sizeof(float));
  }
  layer_done(layer);
  return stored;
}

bool PagedKVStore::linear_has_previous() const {
  for (size_t b = 0; b < batch_.size(); ++b) {
    const Seq& s = seqs_[static_cast<size_t>(batch_[b])];
    const int64_t before = step_open_ ? step_base_[b] : s.len;
    if (before > 0) return true;
  }
  return false;
}

// --- compressed (CSA/HCA) and indexed (DSA) layers -------------------------------------------

int64_t PagedKVStore::compress_rate(int layer) const {
  const int g = compressed_group_of_layer(layer);
  return g < 0 ? 0 : groups_[static_cast<size_t>(g)].rate;
}

bool PagedKVStore::has_indexer_stream(int layer) const {
  return is_csa(config_.layer_types[static_cast<size_t>(layer)]);
}

int64_t PagedKVStore::compressor_width(int layer, CompressedStream s) const {
  return stream_width(config_, config_.layer_types[static_cast<size_t>(layer)], s);
}

int64_t PagedKVStore::entry_width(int layer, CompressedStream s) const {
  (void)layer;
  return s == CompressedStream::kIndexer ? config_.compressed.index_head_dim : config_.head_dim;
}

PagedKVStore::CompressorSlot PagedKVStore::compressor_slot(int layer, CompressedStream s,
                                                           int32_t slot) {
  const std::string& type = config_.layer_types[static_cast<size_t>(layer)];
  const int64_t r = compress_rate(layer);
  float* base = slots_->slot_data(slot) + cstate_offset_[static_cast<size_t>(layer)];
  if (s == CompressedStream::kIndexer)
    base +=
        stream_state_elems(r, compressor_width(layer, CompressedStream::kCompressor), is_csa(type));
  const int64_t w = compressor_width(layer, s);
  float* ov = base + 2 * (r - 1) * w;
  return {base, base + (r - 1) * w, ov, ov + r * (w / 2)};
}

void PagedKVStore::open_step_for_feed(const std::string& where, int64_t tokens) {
  if (step_open_) return;
  if (batch_.empty())
    bad(where + "no sequence yet: call update(kv, kv) for this step first (it opens the step)");
  open_step_if_needed(where, static_cast<int64_t>(batch_.size()), tokens);
}

void PagedKVStore::check_compressed_call(int layer, CompressedStream s, int64_t row,
                                         const char* what) {
  const std::string where = "layer " + std::to_string(layer) + " " + what + ": ";
  if (layer < 0 || layer >= static_cast<int>(layer_cgroup_.size()) ||
      compressed_group_of_layer(layer) < 0)
    bad(where + "not a compressed_sparse_attention or heavily_compressed_attention layer");
  if (s == CompressedStream::kIndexer && !has_indexer_stream(layer))
    bad(where + "the indexer stream belongs to compressed_sparse_attention layers only");
  if (s != CompressedStream::kIndexer && s != CompressedStream::kCompressor)
    bad(where + "unknown stream");
  if (step_open_ && (row < 0 || row >= static_cast<int64_t>(batch_.size())))
    bad(where + "row " + std::to_string(row) + " outside the batch of " +
        std::to_string(batch_.size()));
}

CompressionChunk PagedKVStore::compressor_feed(int layer, CompressedStream s, int64_t row,
                                               const TensorView& kv, const TensorView& gate) {
  check_compressed_call(layer, s, row, "store_compression_weights");
  const std::string where = "layer " + std::to_string(layer) + " store_compression_weights: ";
  const int64_t w = compressor_width(layer, s), r = compress_rate(layer);
  if (kv.ndim() != 2 || gate.ndim() != 2 || kv.dim(1) != w || !(kv.shape() == gate.shape()) ||
      !dtype_is_float(kv.dtype()) || !dtype_is_float(gate.dtype()))
    bad(where + "kv and gate must be float [n, " + std::to_string(w) + "]; got " +
        kv.shape().str() + " and " + gate.shape().str());
  const int64_t n = kv.dim(0);
  open_step_for_feed(where, n);
  check_compressed_call(layer, s, row, "store_compression_weights");
  if (n != step_tokens_)
    bad(where + std::to_string(n) + " rows in a step of " + std::to_string(step_tokens_) +
        " tokens (feed each row's new tokens, all of them, once per step)");
  StreamStep& ss = streams_[static_cast<size_t>(layer * 2 + static_cast<int>(s))];
  const auto b = static_cast<size_t>(row);
  if (ss.fed[b] != 0) bad(where + "row " + std::to_string(row) + " fed twice in one step");
  const int64_t base = step_base_[b], buffered = base % r, total = buffered + n;
  const int64_t nw = total / r, keep = total % r;
  const CompressorSlot cs = compressor_slot(layer, s, seqs_[static_cast<size_t>(batch_[b])].slot);
  const TensorView buf_kv(cs.buf_kv, DType::kF32, {r - 1, w});
  const TensorView buf_gate(cs.buf_gate, DType::kF32, {r - 1, w});
  for (Tensor* t : {&ss.chunk_kv, &ss.chunk_gate})
    if (!t->defined() || t->size_bytes() == 0 || t->view().dim(0) < nw * r || t->view().dim(1) != w)
      *t = Tensor::empty(DType::kF32, {std::max<int64_t>(1, nw * r), w});
  CompressionChunk out;
  out.kv = ss.chunk_kv.view().slice(0, 0, nw * r);
  out.gate = ss.chunk_gate.view().slice(0, 0, nw * r);
  out.first_window_position = (base / r) * r;
  out.n_windows = nw;
  if (nw > 0) {
    for (const auto& [buf, src, dst] :
         {std::tuple{buf_kv, kv, out.kv}, std::tuple{buf_gate, gate, out.gate}}) {
      if (buffered > 0) copy_view(buf.slice(0, 0, buffered), dst.slice(0, 0, buffered));
      copy_view(src.slice(0, 0, nw * r - buffered), dst.slice(0, buffered, nw * r));
      if (keep > 0) copy_view(src.slice(0, n - keep, n), buf.slice(0, 0, keep));
    }
  } else if (n > 0) {
    copy_view(kv, buf_kv.slice(0, buffered, buffered + n));
    copy_view(gate, buf_gate.slice(0, buffered, buffered + n));
  }
  ss.windows[b] = nw;
  ss.fed[b] = nw > 0 ? 1 : 2;
  if (nw == 0) part_done(layer);
  return out;
}

OverlapPrior PagedKVStore::compressor_overlap(int layer, CompressedStream s, int64_t row,
                                              const CompressionChunk& chunk) {
  check_compressed_call(layer, s, row, "update_overlap_state");
  const std::string where = "layer " + std::to_string(layer) + " update_overlap_state: ";
  if (!has_indexer_stream(layer)) bad(where + "only compressed_sparse_attention layers overlap");
  if (!step_open_) bad(where + "no open step (call store_compression_weights first)");
  StreamStep& ss = streams_[static_cast<size_t>(layer * 2 + static_cast<int>(s))];
  const auto b = static_cast<size_t>(row);
  if (ss.fed[b] != 1)
    bad(where + "row " + std::to_string(row) +
        ": call it once, after store_compression_weights returned windows");
  const int64_t w = compressor_width(layer, s), r = compress_rate(layer), nw = ss.windows[b];
  if (chunk.n_windows != nw || chunk.kv.ndim() != 2 || chunk.gate.ndim() != 2 ||
      chunk.kv.dim(0) != nw * r || chunk.kv.dim(1) != w ||
      !(chunk.kv.shape() == chunk.gate.shape()))
    bad(where + "the chunk must be the one store_compression_weights returned ([" +
        std::to_string(nw * r) + ", " + std::to_string(w) + "] kv and gate)");
  const CompressorSlot cs = compressor_slot(layer, s, seqs_[static_cast<size_t>(batch_[b])].slot);
  const TensorView ov_kv(cs.ov_kv, DType::kF32, {r, w / 2});
  const TensorView ov_gate(cs.ov_gate, DType::kF32, {r, w / 2});
  OverlapPrior prior;
  if (step_base_[b] / r > 0) {  // a window was folded by an earlier call: its Ca half
    for (Tensor* t : {&ss.prior_kv, &ss.prior_gate})
      if (!t->defined() || t->size_bytes() == 0 || !(t->view().shape() == ov_kv.shape()))
        *t = Tensor::empty(DType::kF32, {r, w / 2});
    prior.kv = ss.prior_kv.view();
    prior.gate = ss.prior_gate.view();
    copy_view(ov_kv, prior.kv);
    copy_view(ov_gate, prior.gate);
  }
  copy_view(chunk.kv.slice(0, (nw - 1) * r, nw * r).slice(1, 0, w / 2), ov_kv);
  copy_view(chunk.gate.slice(0, (nw - 1) * r, nw * r).slice(1, 0, w / 2), ov_gate);
  ss.fed[b] = 3;
  return prior;
}

void PagedKVStore::compressor_entries(int layer, CompressedStream s, int64_t row,
                                      const TensorView& entries) {
  check_compressed_call(layer, s, row, "update_compressor_states");
  const std::string where = "layer " + std::to_string(layer) + " update_compressor_states: ";
  const int64_t d = entry_width(layer, s), r = compress_rate(layer), bt = config_.block_tokens;
  if (entries.ndim() != 2 || (entries.dim(0) > 0 && entries.dim(1) != d) ||
      !dtype_is_float(entries.dtype()) || (entries.dim(0) > 0 && entries.stride(1) != 1))
    bad(where + "entries must be float [n_windows, " + std::to_string(d) +
        "] with unit innermost stride; got " + entries.shape().str());
  StreamStep& ss = streams_[static_cast<size_t>(layer * 2 + static_cast<int>(s))];
  const auto b = static_cast<size_t>(row);
  // A chunk without windows needs no entries: the feed finished the row already.
  if (entries.dim(0) == 0 && (!step_open_ || ss.fed[b] == 2)) return;
  if (!step_open_) bad(where + "no open step (call store_compression_weights first)");
  const uint8_t want = has_indexer_stream(layer) ? 3 : 1;
  if (ss.fed[b] != want)
    bad(where + "row " + std::to_string(row) + ": call it once per step, after " +
        (want == 3 ? "update_overlap_state" : "store_compression_weights"));
  if (entries.dim(0) != ss.windows[b])
    bad(where + std::to_string(entries.dim(0)) + " entries for a chunk of " +
        std::to_string(ss.windows[b]) + " windows");
  const Seq& sq = seqs_[static_cast<size_t>(batch_[b])];
  const std::vector<int32_t>& table =
      sq.tables[static_cast<size_t>(compressed_group_of_layer(layer))];
  const TensorView pages =
      (s == CompressedStream::kIndexer ? x_pages_ : c_pages_)[static_cast<size_t>(layer)].view();
  const int64_t e0 = step_base_[b] / r;
  for (int64_t i = 0; i < entries.dim(0); ++i) {
    const int64_t e = e0 + i;
    convert_n(entries.ptr(i), entries.dtype(),
              pages.ptr(table[static_cast<size_t>(e / bt)], 0, e % bt), config_.dtype,
              static_cast<size_t>(d));
  }
  ss.fed[b] = 2;
  part_done(layer);
}

int64_t PagedKVStore::compressed_entries(int layer, CompressedStream s, int64_t row) const {
  const int64_t r = compress_rate(layer);
  if (r == 0) bad("layer " + std::to_string(layer) + " has no compressed entries");
  if (row < 0 || row >= static_cast<int64_t>(batch_.size())) return 0;
  const auto b = static_cast<size_t>(row);
  const int64_t len = seqs_[static_cast<size_t>(batch_[b])].len;
  if (!step_open_ || step_wrote_[static_cast<size_t>(layer)]) return len / r;
  const StreamStep& ss = streams_[static_cast<size_t>(layer * 2 + static_cast<int>(s))];
  return ss.fed[b] == 2 ? len / r : step_base_[b] / r;
}

KVSpan PagedKVStore::compressed_span(int layer, CompressedStream s) {
  check_compressed_call(layer, s, 0, "compressed");
  StreamStep& ss = streams_[static_cast<size_t>(layer * 2 + static_cast<int>(s))];
  const int64_t bt = config_.block_tokens;
  const auto g = static_cast<size_t>(compressed_group_of_layer(layer));
  ss.indptr.assign(1, 0);
  ss.indices.clear();
  ss.indices.reserve(1);  // data() set even without entries (kernels check the pointers)
  ss.last.clear();
  for (size_t b = 0; b < batch_.size(); ++b) {
    const int64_t n = compressed_entries(layer, s, static_cast<int64_t>(b));
    const std::vector<int32_t>& t = seqs_[static_cast<size_t>(batch_[b])].tables[g];
    ss.indices.insert(ss.indices.end(), t.begin(), t.begin() + ceil_div(n, bt));
    ss.indptr.push_back(static_cast<int32_t>(ss.indices.size()));
    ss.last.push_back(n == 0 ? 0 : static_cast<int32_t>((n - 1) % bt + 1));
  }
  KVSpan span;
  span.kind = KVSpanKind::kPaged;
  span.kv_offset = 0;
  PagedKV& p = span.paged;
  p.k_pages =
      (s == CompressedStream::kIndexer ? x_pages_ : c_pages_)[static_cast<size_t>(layer)].view();
  p.v_pages = p.k_pages;
  p.batch = static_cast<int64_t>(batch_.size());
  p.block_tokens = bt;
  p.indptr = ss.indptr.data();
  p.indices = ss.indices.data();
  p.last_page_len = ss.last.data();
  return span;
}

KVSpan PagedKVStore::write_indexer(int layer, const TensorView& keys) {
  const std::string where = "layer " + std::to_string(layer) + " update_indexer: ";
  if (layer < 0 || layer >= static_cast<int>(config_.layer_types.size()) ||
      !is_indexed_layer_type(config_.layer_types[static_cast<size_t>(layer)]))
    bad(where + "not a deepseek_sparse_attention layer");
  const int64_t c = config_.compressed.index_head_dim;
  if (keys.ndim() != 4 || keys.dim(1) != 1 || keys.dim(3) != c || !dtype_is_float(keys.dtype()) ||
      keys.stride(3) != 1)
    bad(where + "index_keys must be float [B, 1, n, " + std::to_string(c) +
        "] with unit innermost stride; got " + keys.shape().str());
  open_step_if_needed(where, keys.dim(0), keys.dim(2));
  if (x_written_[static_cast<size_t>(layer)] || step_wrote_[static_cast<size_t>(layer)])
    bad(where + "updated twice in one step");
  const auto g = static_cast<size_t>(layer_group_[static_cast<size_t>(layer)]);
  const int64_t bt = config_.block_tokens;
  const TensorView pages = x_pages_[static_cast<size_t>(layer)].view();
  for (size_t b = 0; b < batch_.size(); ++b) {
    const std::vector<int32_t>& table = seqs_[static_cast<size_t>(batch_[b])].tables[g];
    for (int64_t t = 0; t < step_tokens_; ++t) {
      const int64_t pos = step_base_[b] + t;
      convert_n(keys.ptr(static_cast<int64_t>(b), 0, t), keys.dtype(),
                pages.ptr(table[static_cast<size_t>(pos / bt)], 0, pos % bt), config_.dtype,
                static_cast<size_t>(c));
    }
  }
  x_written_[static_cast<size_t>(layer)] = 1;
  KVSpan span;
  span.kind = KVSpanKind::kPaged;
  span.kv_offset = 0;
  PagedKV& p = span.paged;
  p.k_pages = pages;
  p.v_pages = pages;
  p.batch = static_cast<int64_t>(batch_.size());
  p.block_tokens = bt;
  p.indptr = indptr_[g].data();
  p.indices = indices_[g].data();
  p.last_page_len = last_len_[g].data();
  part_done(layer);
  return span;
}

}  // namespace kvcache
