// `kvcache run`: until the model runtime lands, a demo of the cache containers. Every
// registered container receives the same seeded random K/V stream (a prefill, then one token
// at a time); the table shows what each keeps and what that costs, and a check confirms that
// each container's last span equals the matching slice of the plain dynamic cache's (quantized
// containers: the residual bit for bit, the packed part's largest error shown). A second
// table runs a whole model's Cache (sliding/full mix, KV-shared tail layers).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "cache/cache.h"
#include "cache/dense_layer.h"
#include "cache/offloaded_layer.h"
#include "cache/paged_layer.h"
#include "cache/quantized_layer.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/attention_quant.h"
#include "runtime/generate.h"
#include "runtime/model_loader.h"
#include "runtime/session.h"
#include "tools/commands.h"
#include "tools/model_table.h"
#include "tools/option_rules.h"

namespace kvcache::tools {
namespace {

struct RunOptions {
  int64_t prefill = 100;
  int64_t decode = 400;
  int64_t batch = 1;
  int64_t kv_heads = 2;
  int64_t head_dim = 64;
  int64_t window = 128;
  int64_t chunk = 64;
  std::string dtype = "f16";
  uint32_t seed = 42;
};

// Bitwise equality of two views of the same shape and dtype.
bool same_bits(const TensorView& a, const TensorView& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  const size_t row = dtype_bytes(a.dtype(), a.dim(3));
  for (int64_t i = 0; i < a.dim(0); ++i)
    for (int64_t h = 0; h < a.dim(1); ++h)
      for (int64_t s = 0; s < a.dim(2); ++s)
        if (std::memcmp(a.ptr(i, h, s), b.ptr(i, h, s), row) != 0) return false;
  return true;
}

// Largest |a - b| of two views of one shape (any float dtypes).
double max_abs_diff(const TensorView& a, const TensorView& b) {
  Tensor fa = Tensor::empty(DType::kF32, a.shape()), fb = Tensor::empty(DType::kF32, b.shape());
  copy_view(a, fa.view());
  copy_view(b, fb.view());
  double err = 0;
  for (int64_t i = 0; i < fa.numel(); ++i)
    err = std::max(err,
                   static_cast<double>(std::fabs(fa.data_as<float>()[i] - fb.data_as<float>()[i])));
  return err;
}

std::string human_bytes(size_t n) {
  if (n >= (size_t{1} << 20)) return fmt::format("{:.2f} MiB", static_cast<double>(n) / (1 << 20));
  if (n >= 1024) return fmt::format("{:.1f} KiB", static_cast<double>(n) / 1024);
  return fmt::format("{} B", n);
}

// The K/V stream every container receives: [B, H_kv, S, D] f32, sliced per step.
struct Stream {
  Tensor k, v;
};

Stream make_stream(const RunOptions& o) {
  const int64_t total = o.prefill + o.decode;
  std::mt19937 rng(o.seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Stream s{Tensor::empty(DType::kF32, {o.batch, o.kv_heads, total, o.head_dim}),
           Tensor::empty(DType::kF32, {o.batch, o.kv_heads, total, o.head_dim})};
  for (Tensor* t : {&s.k, &s.v})
    for (int64_t i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = dist(rng);
  return s;
}

// Feeds the stream (prefill, then single tokens) to `step`, which returns the span.
template <typename Step>
KVSpan feed(const RunOptions& o, const Stream& s, Step&& step) {
  KVSpan last;
  int64_t pos = 0;
  while (pos < o.prefill + o.decode) {
    const int64_t n = pos == 0 ? o.prefill : 1;
    last = step(s.k.view().slice(2, pos, pos + n), s.v.view().slice(2, pos, pos + n));
    pos += n;
  }
  return last;
}

// A greedy story from the model, when it has a vocabulary: what a real model does with the
// cache before the tables measure it.
void print_story(const std::string& spec) {
  const LoadedModel lm = load_model(spec, LoadOptions{});
  if (lm.tokenizer == nullptr) return;
  const Tokenizer& tok = *lm.tokenizer;
  const std::string text = "Once upon a time";
  std::vector<int32_t> prompt;
  if (lm.add_bos) prompt.push_back(tok.bos_id() >= 0 ? tok.bos_id() : 1);
  for (int32_t id : tok.encode(text)) prompt.push_back(id);
  SessionConfig sc;
  sc.cache.implementation = "dynamic";
  Session session(*lm.model, sc);
  GenerateParams gp;
  gp.max_new_tokens = 120;
  gp.sampler.temperature = 0.0f;
  if (tok.eos_id() >= 0) gp.stop_ids.push_back(tok.eos_id());
  if (tok.bos_id() >= 0) gp.stop_ids.push_back(tok.bos_id());
  fmt::print("kvcache run --model {}: greedy, {} new tokens at most, dynamic cache\n\n  {}", spec,
             gp.max_new_tokens, text);
  int32_t prev = prompt.back();
  const GenerateStats st = generate(session, prompt, gp, [&](int32_t id) {
    std::string p = tok.piece_after(prev, id);
    for (size_t at = 0; (at = p.find('\n', at)) != std::string::npos; at += 3)
      p.insert(at + 1, "  ");
    fmt::print("{}", p);
    std::fflush(stdout);
    prev = id;
  });
  fmt::print("\n\n  {} prompt + {} new tokens, decode {:.0f} tok/s, KV cache {} bytes\n\n",
             st.prompt_tokens, st.new_tokens, st.decode_tps(), st.kv_bytes);
}

CacheConfig base_config(const RunOptions& o) {
  CacheConfig c;
  c.sliding_window = o.window;
  c.attention_chunk_size = o.chunk;
  c.options.max_cache_len = o.prefill + o.decode;
  c.options.kv_dtype = parse_dtype(o.dtype);
  return c;
}

void run_demo(const RunOptions& o) {
  if (o.prefill < 1 || o.decode < 0 || o.batch < 1 || o.kv_heads < 1 || o.head_dim < 1) {
    throw Error(ErrorKind::kInvalidArgument,
                "run: --prefill, --batch, --kv-heads and --head-dim must be >= 1, --decode >= 0");
  }
  const int64_t total = o.prefill + o.decode;
  const Stream stream = make_stream(o);
  const CacheConfig config = base_config(o);
  const size_t token_bytes = dtype_bytes(*config.options.kv_dtype, 2 * o.kv_heads * o.head_dim);

  fmt::print("kvcache run: each registered container alone, fed random K/V (no model)\n");
  fmt::print(
      "  one layer: batch {}, {} KV heads x head dim {}, {} storage -> {} B per token "
      "(K+V, all rows)\n",
      o.batch, o.kv_heads, o.head_dim, o.dtype, token_bytes * static_cast<size_t>(o.batch));
  fmt::print(
      "  stream: prefill {} tokens, then decode {} one at a time ({} tokens); "
      "sliding window W={}, chunk C={}, static max_cache_len={}\n\n",
      o.prefill, o.decode, total, o.window, o.chunk, config.options.max_cache_len);

  // Reference: the plain dynamic cache keeps everything.
  auto reference = LayerRegistry::create("dynamic", "full_attention", config, 0);
  const KVSpan ref = feed(
      o, stream, [&](const TensorView& k, const TensorView& v) { return reference->update(k, v); });

  fmt::print("{:<28} {:>7} {:>7} {:>11} {:>10} {:>11}  {}\n", "container", "tokens", "stored",
             "bytes", "bytes/tok", "moved", "last step vs dynamic/full_attention");
  int mismatches = 0;
  // Containers that are not fed a plain K/V stream: linear-attention state (conv and recurrent
  // updates, tests/cache/linear_state_layer_test.cc), and DeepSeek's compressed and indexed
  // layers (K==V rows plus compressor streams or indexer keys from a model,
  // tests/cache/compressed_layer_test.cc, indexed_layer_test.cc, paged_compressed_test.cc).
  const std::set<std::string> own_protocol = {"linear_attention", "compressed_sparse_attention",
                                              "heavily_compressed_attention",
                                              "deepseek_sparse_attention"};
  std::vector<std::string> skipped;
  for (const std::string& name : LayerRegistry::names()) {
    const auto slash = name.find('/');
    if (own_protocol.count(name.substr(slash + 1)) != 0) {
      skipped.push_back(name);
      continue;
    }
    auto layer = LayerRegistry::create(name.substr(0, slash), name.substr(slash + 1), config, 0);
    const KVSpan span = feed(
        o, stream, [&](const TensorView& k, const TensorView& v) { return layer->update(k, v); });
    int64_t n = span.k.dim(2), first = span.kv_offset;
    bool ok = false;
    int64_t stored = -1;
    std::string verdict;
    if (span.kind == KVSpanKind::kPaged) {
      // Pages read through the table; a sliding group keeps, between steps, what the next
      // query may see (W - 1 keys).
      const Tensor k = gather_paged(span.paged, false), v = gather_paged(span.paged, true);
      n = k.view().dim(2);
      first = name.find("sliding") != std::string::npos ? std::max<int64_t>(0, total - o.window + 1)
                                                        : 0;
      ok = n == total && same_bits(k.view().slice(2, first, total), ref.k.slice(2, first, total)) &&
           same_bits(v.view().slice(2, first, total), ref.v.slice(2, first, total));
      n = total - first;
      stored = static_cast<const PagedLayer&>(*layer).store().stats(0).live_tokens;
      verdict = ok ? "equal" : "DIFFERENT";
    } else if (span.kind == KVSpanKind::kQuantized) {
      // Packed blocks + residual: the residual is the stream's last tokens bit for bit; the
      // packed part is lossy by design, so its largest error is shown, not judged here (the
      // per-group half-step bound is tested in tests/kernels/kv_quant_test.cc).
      const QuantKV& qk = span.quant;
      n = qk.seq_len();
      const int64_t p = span.kv_offset + qk.packed_len();
      ok = span.kv_offset + n == total && same_bits(qk.k_residual, ref.k.slice(2, p, total)) &&
           same_bits(qk.v_residual, ref.v.slice(2, p, total));
      Tensor dk, dv;
      dequantize_quant_kv(qk, &dk, &dv);
      const double err = qk.packed_len() == 0
                             ? 0.0
                             : std::max(max_abs_diff(dk.view().slice(2, 0, qk.packed_len()),
                                                     ref.k.slice(2, span.kv_offset, p)),
                                        max_abs_diff(dv.view().slice(2, 0, qk.packed_len()),
                                                     ref.v.slice(2, span.kv_offset, p)));
      verdict = ok ? fmt::format("residual equal, packed max|err| {:.3g}", err) : "DIFFERENT";
      const auto* quant = dynamic_cast<const QuantizedLayer*>(layer.get());
      stored = quant ? quant->packed_length() + quant->residual_length() : -1;
    } else {
      // A recompute container's sequence starts at its latest update (it keeps nothing
      // between calls): its span's positions count from there.
      first = total - layer->seq_length() + span.kv_offset;
      ok = first + n == total && same_bits(span.k, ref.k.slice(2, first, total)) &&
           same_bits(span.v, ref.v.slice(2, first, total));
      const auto* dense = dynamic_cast<const DenseLayer*>(layer.get());
      // An offloaded layer keeps every token, in its file (bytes: only its resident slot).
      stored = dense                                              ? dense->stored_tokens()
               : dynamic_cast<const OffloadedLayer*>(layer.get()) ? layer->seq_length()
                                                                  : -1;
      verdict = ok ? "equal" : "DIFFERENT";
    }
    mismatches += ok ? 0 : 1;
    fmt::print("{:<28} {:>7} {:>7} {:>11} {:>10} {:>11}  {} (keys [{}, {}))\n", name,
               layer->seq_length(), stored, human_bytes(layer->bytes()),
               layer->bytes() / static_cast<size_t>(total),
               human_bytes(layer->stats().bytes_copied), verdict, first, first + n);
  }
  fmt::print(
      "\n  tokens: positions seen; stored: tokens kept for later steps; bytes: resident "
      "(capacity + workspace);\n  moved: bytes the container copied on its own "
      "(growth, compaction, workspace), beyond writing the new tokens;\n  recompute/*: the "
      "no-cache reference's container, which holds only its latest update;\n  "
      "offloaded*/full_attention: "
      "kept in a file, bytes = the resident slot it holds (at most two per cache; windows stay "
      "resident).\n");
  fmt::print(
      "  not fed this stream (state or compressor updates from a model; see their tests): "
      "{}\n\n",
      fmt::join(skipped, ", "));

  // A whole model: Gemma-3n-like mix with the last two layers reading earlier layers' KV.
  CacheConfig model = config;
  model.layer_types = {"sliding_attention", "sliding_attention", "full_attention",
                       "sliding_attention", "sliding_attention", "full_attention",
                       "sliding_attention", "full_attention"};
  model.num_kv_shared_layers = 2;
  fmt::print(
      "model cache: 8 layers (sliding x5, full x3, pattern s s f s s f s f), last 2 "
      "KV-shared\n");
  fmt::print("{:<14} {:>7} {:>12} {:>10}   {}\n", "implementation", "owning", "bytes", "bytes/tok",
             "vs. 8 dynamic full layers");
  const size_t all_full = 8 * token_bytes * static_cast<size_t>(o.batch * total);
  for (const char* impl : {"dynamic", "static"}) {
    model.options.implementation = impl;
    Cache cache(model);
    int owning = 0;
    for (int l = 0; l < cache.num_layers(); ++l) owning += cache.is_shared(l) ? 0 : 1;
    feed(o, stream, [&](const TensorView& k, const TensorView& v) {
      KVSpan s;
      for (int l = 0; l < cache.num_layers(); ++l)
        if (!cache.is_shared(l)) s = cache.update(l, k, v);
      return s;
    });
    fmt::print("{:<14} {:>7} {:>12} {:>10}   {:.1f}% ({} if every layer kept every token)\n", impl,
               owning, human_bytes(cache.bytes()), cache.bytes() / static_cast<size_t>(total),
               100.0 * static_cast<double>(cache.bytes()) / static_cast<double>(all_full),
               human_bytes(all_full));
  }
  fmt::print("\n{}\n", mismatches == 0 ? "check: every container returned exactly the keys and "
                                         "values the dynamic cache holds for those positions"
                                       : "check FAILED: some containers differ (see above)");
  if (mismatches != 0) {
    throw Error(ErrorKind::kUnsupported, fmt::format("{} container(s) disagree", mismatches));
  }
}

}  // namespace

void register_run(CLI::App& app) {
  auto opts = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run", "Demo: feed every cache container the same random K/V and print what each keeps");
  cmd->add_option("--prefill", opts->prefill, "tokens in the first (prefill) update")
      ->capture_default_str();
  cmd->add_option("--decode", opts->decode, "single-token updates after the prefill")
      ->capture_default_str();
  cmd->add_option("--batch", opts->batch, "sequences (batch rows)")->capture_default_str();
  cmd->add_option("--kv-heads", opts->kv_heads, "KV heads per layer")->capture_default_str();
  cmd->add_option("--head-dim", opts->head_dim, "head dimension")->capture_default_str();
  cmd->add_option("--window", opts->window, "sliding window W (sliding layers)")
      ->capture_default_str();
  cmd->add_option("--chunk", opts->chunk, "attention chunk size C (chunked layers)")
      ->capture_default_str();
  cmd->add_option("--dtype", opts->dtype, "storage dtype: f32, f16, bf16")->capture_default_str();
  cmd->add_option("--seed", opts->seed, "random seed of the K/V stream")->capture_default_str();
  // The model table (runtime/container_report.h) comes first: the default dummy model, or
  // --model FILE; --model none skips it.
  auto model = std::make_shared<ModelTableOptions>();
  model->model = "stories260K";
  cmd->add_option("--model", model->model,
                  "model for the story and the per-container table (stories260K: built in; a "
                  "file, folder, dummy:NAME, or none)")
      ->capture_default_str();
  cmd->callback([cmd, opts, model] {
    check_options(*cmd, RunShape{});  // every option takes effect
    if (model->model != "none") {
      print_story(model->model);
      print_model_table(*model);
    }
    run_demo(*opts);
  });
}

}  // namespace kvcache::tools
