// The KV memory bill of a model, computed from its own config before anything is allocated
// (`kvcache plan`). A config (HF config.json, GGUF metadata, or an embedded preset) becomes a
// list of per-layer storage descriptions; a storage format (f16, q4 with group scales, ...) and
// a context/batch turn them into bytes. The formulas are the KV cache notes' (section
// "结构×cache主表"): 2·L·H_kv·d_h·b for GQA, L·(d_c+d_r)·b for MLA, b·d·Σ1/r for compressed
// K==V layers, a constant H_v·d_k·d_v·b + (k−1)·d_qkv·b for linear attention, 0 for moe/mlp.
// kvcache keeps linear-attention state in f32 whatever the KV format (cache/linear_state_layer.h),
// so b = 4 for it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/model_file.h"

namespace kvcache {

class GgufFile;

enum class PlanLayerKind {
  kAttention,   // full attention: K and V per token (MHA/MQA/GQA)
  kWindowed,    // sliding or chunked: K and V per token, at most window-1 tokens kept
  kMla,         // MLA latent + rotated key, one copy serves K and V (no factor 2)
  kCompressed,  // compressed entries (CSA/HCA), K==V, one entry per `compress_rate` tokens
  kLinear,      // linear-attention / conv state: constant per request
  kHybrid,      // linear state and full-attention KV in one layer
  kEmpty,       // moe / mlp placeholder layers: store nothing
  kShared,      // num_kv_shared_layers: reads an earlier layer's cache, stores nothing
};
const char* plan_layer_kind_name(PlanLayerKind k);

// What one layer stores, in elements (the storage format turns elements into bytes).
struct PlanLayer {
  std::string type;  // the config's layer type name ("full_attention", ...)
  PlanLayerKind kind = PlanLayerKind::kAttention;
  int64_t kv_heads = 0;
  int64_t k_dim = 0;          // per head; MLA: kv_lora_rank + qk_rope_head_dim
  int64_t v_dim = 0;          // per head; 0 when K==V (MLA, compressed, V4's shared KV)
  int64_t window = 0;         // kWindowed: sliding window or chunk size W (keeps W-1)
  int64_t compress_rate = 1;  // kCompressed: tokens per stored entry
  // kLinear/kHybrid: constant state, in elements: H_v·d_k·d_v + (k−1)·d_qkv, plus the
  // (k−1)·d_qkv copy of the conv window kvcache's layer keeps for the conv kernel.
  int64_t state_elems = 0;
  // kLinear/kHybrid: what a prefix-cache snapshot of the layer keeps (the state without the
  // kernel's copy): H_v·d_k·d_v + (k−1)·d_qkv.
  int64_t snapshot_elems = 0;
  // kCompressed: what DeepSeek-V4's containers keep besides the entries (transformers'
  // DeepseekV4HCACache / DeepseekV4CSACache, cache/compressed_cache_layer.h): the K==V sliding
  // window (W-1 rows of k_dim), the compressor's buffer (fewer than compress_rate rows of kv and
  // gate, stream_width f32 each: 2·k_dim for CSA's two overlapping series, k_dim for HCA), CSA's
  // overlap (the last window's Ca half: compress_rate x stream_width/2, kv and gate, f32) and
  // CSA's indexer (one index_dim key per entry, with its own buffer and overlap at 2·index_dim).
  int64_t compressed_window = 0;  // W (0: none)
  int64_t stream_width = 0;
  int64_t index_dim = 0;  // CSA: index_head_dim; 0: no indexer
  bool overlap = false;   // CSA
};

// One compressed layer's bytes for one request of `context` tokens, by part (see PlanLayer).
struct CompressedBill {
  int64_t window_rows = 0, entries = 0, buffered = 0;  // rows: min(S, W-1), S / r, S % r
  double window = 0;                                   // K==V window rows x k_dim, KV format
  double entries_bytes = 0;                            // entries x k_dim, KV format
  double index_keys = 0;                               // entries x index_dim, KV format (CSA)
  double buffers = 0;   // buffered x (kv + gate) x stream_width (+ the indexer's), f32
  double overlaps = 0;  // CSA, once a window was folded: r x (kv + gate) x stream_width/2
                        // (+ the indexer's r x 2 x index_dim), f32
  double total() const { return window + entries_bytes + index_keys + buffers + overlaps; }
};

struct PlanModel {
  std::string name;
  std::string source;  // "preset", a file path
  std::vector<PlanLayer> layers;
  int64_t max_context = 0;                     // 0: unknown
  std::optional<int64_t> params;               // parameter count when known
  std::optional<uint64_t> weight_bytes_exact;  // GGUF: the stored tensor bytes
  // Gated DeltaNet dims when the model has linear-attention layers (for the derivation shown).
  struct LinearDims {
    int64_t heads_k = 0, heads_v = 0, head_dim_k = 0, head_dim_v = 0, conv_kernel = 0;
  };
  std::optional<LinearDims> linear;
  // MLA configs: bytes/token per element of the equivalent per-head MHA (for comparison).
  int64_t mha_equivalent_elems_per_token = 0;
  std::vector<std::string> notes;  // assumptions and ignored fields, shown to the user
};

// Builds the plan model from config.json text through the runtime's reader of the cache's shape
// (model/decoder_layout.h). Fields that do not shape the cache are ignored. Throws
// Error(kFormat) naming `source` and the key for malformed JSON, a missing essential field
// (num_hidden_layers, attention heads), or layer types it cannot interpret.
PlanModel plan_model_from_hf_json(const std::string& json_text, const std::string& source);
// From a GGUF file's metadata (any architecture with {arch}.block_count and head counts).
PlanModel plan_model_from_gguf(const std::string& path);
PlanModel plan_model_from_gguf(const GgufFile& gguf);
// From a config or GGUF path (a folder: its config.json).
PlanModel plan_model_from_path(const std::string& path);
// From the runtime's ModelConfig (the models kvcache runs).
PlanModel plan_model_from_config(const ModelConfig& config, const std::string& name);

// Embedded presets with public config values (see kv_plan_presets.cc for sources).
std::vector<std::string> plan_preset_names();
PlanModel plan_preset(const std::string& name);                // throws Error listing the names
const std::string& plan_preset_json(const std::string& name);  // its config.json text

// How KV elements are stored. Float formats: `elem_bits` per element. Quantized formats
// (q8/q4/q2): `elem_bits` per element plus `group_overhead_bytes` (f16 scale + f16 zero point)
// per group of `group` elements along a row, rows rounded up to whole groups.
struct KvFormat {
  std::string name = "f16";
  int64_t elem_bits = 16;
  int64_t group = 0;  // 0: no groups
  int64_t group_overhead_bytes = 0;
  // Bytes of a row of `n` elements.
  double row_bytes(int64_t n) const;
};
// "f32", "f16", "bf16", "f8", "q8", "q4", "q2" (group default 64). Throws Error otherwise.
KvFormat parse_kv_format(const std::string& name, int64_t group = 64);

struct PlanOptions {
  int64_t context = 4096;
  int64_t batch = 1;
  KvFormat format;
  int64_t block_tokens = 1;           // paged rounding: stored tokens rounded up to a multiple
  double weight_bytes_per_param = 2;  // when weights come from a parameter count (bf16)
  std::optional<uint64_t> budget_bytes;
  // Hybrid models on the paged prefix cache (serve/batch's options of the same names): a
  // snapshot of one sequence's linear state every snapshot_every_blocks blocks of block_tokens,
  // at most max_snapshots kept (an arena allocated up front, outside the per-request bill).
  int64_t snapshot_every_blocks = 4;
  int64_t max_snapshots = 16;
};

struct PlanRow {
  std::string type;
  PlanLayerKind kind;
  int64_t count = 0;
  double bytes_per_token = 0;  // per layer type, all its layers, before any window cap
  int64_t stored_tokens = 0;   // per layer and request at `context` (after caps and rounding)
  double state_bytes = 0;      // constant state, all layers of the type, per request
  double total_bytes = 0;      // all layers of the type, all requests
};

struct PlanResult {
  std::vector<PlanRow> rows;
  double kv_bytes_per_token = 0;  // the notes' per-token figure (no caps)
  double state_bytes_per_request = 0;
  double snapshot_bytes_each = 0;  // hybrid models: one sequence's linear state (f32)
  double snapshot_bytes = 0;       // max_snapshots of them, once per server (not per request)
  double kv_bytes_total = 0;       // the real bill for context × batch, states included
  double mha_equivalent_bytes_per_token = 0;  // MLA models only
  double uncompressed_bytes_per_token = 0;    // compressed models: every rate taken as 1
  // Compressed models: what each further token adds once every window is full (the entries
  // and indexer keys of compressed layers, full-attention layers' K/V; windows, buffers and
  // overlaps stay bounded), and the compressed layers' bill at `context` by part, per request.
  double growth_bytes_per_token = 0;
  CompressedBill compressed;  // summed over the compressed layers (row counts: unused)
  std::optional<double> weight_bytes;
  // With a budget: requests of `context` that fit, and the longest context for `batch`
  // requests (-1: unbounded, e.g. only windowed/linear layers; 0: not even one token).
  std::optional<int64_t> max_requests;
  std::optional<int64_t> max_context;
};

// Total KV bytes for one request of `context` tokens (windows capped, states included).
double plan_request_bytes(const PlanModel& model, const PlanOptions& options, int64_t context);
// A kCompressed layer's bill at `context` (windows and entries rounded to block_tokens).
CompressedBill compressed_layer_bill(const PlanLayer& layer, const PlanOptions& options,
                                     int64_t context);
PlanResult compute_plan(const PlanModel& model, const PlanOptions& options);

// Parses "24GiB", "13.4GB", "512MiB", "1000000" (bytes). Throws Error on anything else.
uint64_t parse_byte_size(const std::string& text);
// "2.00 GiB", "512 KiB", "7.41 KiB", "100 B".
std::string format_bytes(double bytes);

// Renderings for the CLI (and tests).
std::string plan_table(const PlanModel& model, const PlanOptions& options, const PlanResult& r);
std::string plan_json(const PlanModel& model, const PlanOptions& options, const PlanResult& r);
// An SVG plot of KV bytes (batch requests) against context length, log-log, from 1K tokens to
// the model's max context (or 1M), one line for the chosen format and one for f16 reference.
std::string plan_svg(const PlanModel& model, const PlanOptions& options);

}  // namespace kvcache
