#include "runtime/token_cost.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kernels/kv_quant.h"
#include "model/kv_plan.h"

namespace kvcache {

namespace {

bool is_routed_expert(const std::string& name) {
  return name.find(".experts.") != std::string::npos || name.find("_exps") != std::string::npos;
}

double expert_share(const ModelConfig& c) {
  if (c.moe.n_experts <= 0) return 1.0;
  return static_cast<double>(c.moe.n_experts_used) / static_cast<double>(c.moe.n_experts);
}

// The plan's layers, one per model layer (checked: the KV-shared lookup indexes them by layer).
PlanModel plan_of(const Model& model) {
  PlanModel plan = plan_model_from_config(model.config(), "bench");
  if (static_cast<int64_t>(plan.layers.size()) != model.config().n_layers)
    throw Error(ErrorKind::kUnsupported,
                "token cost: the memory plan has " + std::to_string(plan.layers.size()) +
                    " layers for a model of " + std::to_string(model.config().n_layers));
  return plan;
}

const PlanLayer& read_layer(const Model& model, const PlanModel& plan, size_t l) {
  if (plan.layers[l].kind != PlanLayerKind::kShared) return plan.layers[l];
  return plan.layers[static_cast<size_t>(model.kv_source(static_cast<int64_t>(l)))];
}

double layer_bytes(const PlanLayer& layer, const KvFormat& format, int64_t tokens) {
  if (tokens <= 0 && layer.state_elems == 0) return 0;
  PlanModel one;
  one.layers = {layer};
  PlanOptions o;
  o.format = format;
  return plan_request_bytes(one, o, std::max<int64_t>(tokens, 0));
}

// Bytes per token of one KV head in the quantized container's packed blocks (K and V blocks
// of `group` tokens, kernels/kv_quant.h's layouts, so the same sizes the container allocates).
double packed_head_token_bytes(const QuantizedOptions& q, int64_t dk, int64_t dv) {
  const KVBlockFormat f = make_kv_block_format(q.scheme, q.bits, q.group, dk, dv);
  return static_cast<double>(kv_k_block_bytes(f) + kv_v_block_bytes(f)) /
         static_cast<double>(f.group);
}

}  // namespace

double decode_weight_bytes(const Model& model) {
  const ModelConfig& c = model.config();
  const void* embd = model.embeddings().data();
  const bool tied = model.output().data() == embd;
  double bytes = 0;
  for (const auto& [name, t] : model.file().tensors()) {
    const double all = static_cast<double>(dtype_bytes(t.dtype(), t.numel()));
    if (t.data() == embd && !tied) {
      bytes += static_cast<double>(dtype_bytes(t.dtype(), c.dim));
    } else {
      bytes += is_routed_expert(name) ? all * expert_share(c) : all;
    }
  }
  return bytes;
}

namespace {

double kv_read_bytes(const Model& model, const PlanModel& plan, const CacheOptions& cache,
                     int64_t keys) {
  const KvFormat dense = parse_kv_format(dtype_name(cache.kv_dtype.value_or(DType::kF32)));
  const bool quantized = cache.implementation == "quantized";
  double bytes = 0;
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const PlanLayer& L = read_layer(model, plan, l);
    const bool packs = L.kind == PlanLayerKind::kAttention || L.kind == PlanLayerKind::kWindowed;
    if (!quantized || !packs) {
      bytes += layer_bytes(L, dense, keys);
      continue;
    }
    const QuantizedOptions& q = cache.quantized;
    const int64_t cycle = std::max<int64_t>({q.residual, q.group, 1});
    const int64_t res = keys <= 0 ? 0 : std::min(keys, (keys - 1) % cycle + 1);
    // The window caps what is kept in all: the packed part is what the cap leaves past the
    // residual.
    const double all_dense = layer_bytes(L, dense, keys);
    const double res_dense = layer_bytes(L, dense, res);
    const double kept = all_dense > 0 ? all_dense / layer_bytes(L, dense, 1) : 0;
    const int64_t packed = std::max<int64_t>(static_cast<int64_t>(kept + 0.5) - res, 0);
    bytes += res_dense + static_cast<double>(L.kv_heads) * static_cast<double>(packed) *
                             packed_head_token_bytes(q, L.k_dim, L.v_dim > 0 ? L.v_dim : L.k_dim);
  }
  return bytes;
}

}  // namespace

double kv_read_bytes(const Model& model, const CacheOptions& cache, int64_t keys) {
  return kv_read_bytes(model, plan_of(model), cache, keys);
}

double decode_bytes_per_token(const Model& model, const CacheOptions& cache, int64_t depth,
                              int64_t n_gen) {
  if (n_gen <= 0 || depth < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "token cost: a decode test needs n_gen > 0 and depth >= 0");
  const PlanModel plan = plan_of(model);
  double kv = 0;
  for (int64_t j = 0; j < n_gen; ++j) kv += kv_read_bytes(model, plan, cache, depth + j + 1);
  return decode_weight_bytes(model) + kv / static_cast<double>(n_gen);
}

double prefill_flops(const Model& model, int64_t depth, int64_t n_prompt) {
  if (n_prompt <= 0 || depth < 0)
    throw Error(ErrorKind::kInvalidArgument,
                "token cost: a prefill test needs n_prompt > 0 and depth >= 0");
  const ModelConfig& c = model.config();
  const void* embd = model.embeddings().data();
  const void* head = model.output().data();
  double per_token = 0;  // matrix elements a token multiplies
  for (const auto& [name, t] : model.file().tensors()) {
    if (t.ndim() < 2 || t.data() == embd || t.data() == head) continue;
    const double n = static_cast<double>(t.numel());
    per_token += is_routed_expert(name) ? n * expert_share(c) : n;
  }
  const double np = static_cast<double>(n_prompt);
  double flops = 2.0 * per_token * np + 2.0 * static_cast<double>(c.vocab_size * c.dim);
  const PlanModel plan = plan_of(model);
  for (size_t l = 0; l < plan.layers.size(); ++l) {
    const PlanLayer& L = read_layer(model, plan, l);
    if (L.kind == PlanLayerKind::kLinear || L.kind == PlanLayerKind::kEmpty) continue;
    const double dk = static_cast<double>(L.k_dim);
    const double dv = static_cast<double>(L.v_dim > 0 ? L.v_dim : L.k_dim);
    // sum_{i<n} keys(depth + i + 1): an arithmetic series, or its windowed cap.
    double keys = 0;
    if (L.kind == PlanLayerKind::kWindowed && L.window > 0) {
      for (int64_t i = 0; i < n_prompt; ++i)
        keys += static_cast<double>(std::min(depth + i + 1, L.window));
    } else {
      const double d = static_cast<double>(depth);
      keys = np * d + np * (np + 1) / 2;
    }
    flops += 2.0 * static_cast<double>(c.n_heads) * (dk + dv) * keys;
  }
  return flops;
}

}  // namespace kvcache
