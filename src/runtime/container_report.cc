#include "runtime/container_report.h"

#include <chrono>
#include <map>

#include "cache/cache.h"
#include "core/error.h"
#include "kernels/softmax.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace kvcache {

std::vector<ContainerRow> container_report(const Model& model, const ContainerReportParams& p) {
  const ModelConfig& c = model.config();
  if (p.prompt_tokens <= 0 || p.new_tokens <= 0 || p.prompt_tokens + p.new_tokens > c.max_seq_len) {
    throw Error(ErrorKind::kInvalidArgument,
                "container report: prompt + new tokens must fit the context (" +
                    std::to_string(c.max_seq_len) + ")");
  }
  // Implementations that have a container for every layer type of this model.
  std::vector<std::string> caches = p.caches;
  if (caches.empty()) {
    for (const std::string& impl : {std::string("dynamic"), std::string("static")}) {
      bool ok = true;
      for (const std::string& t : c.layer_types) ok = ok && LayerRegistry::contains(impl, t);
      if (ok) caches.push_back(impl);
    }
  }
  uint64_t rng = p.seed;
  std::vector<int32_t> prompt(static_cast<size_t>(p.prompt_tokens));
  for (auto& id : prompt) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    id = static_cast<int32_t>((rng >> 33) % static_cast<uint64_t>(c.vocab_size));
  }
  const int64_t total = p.prompt_tokens + p.new_tokens;
  Forward oracle(model, p.kernel, total);
  const auto vocab = static_cast<size_t>(c.vocab_size);

  std::vector<ContainerRow> rows;
  std::map<DType, std::vector<int32_t>> first_ids;
  for (DType dt : p.kv_dtypes) {
    // "+window": every layer made sliding with a window covering the whole run.
    std::vector<std::string> variants = caches;
    if (LayerRegistry::contains("dynamic", "sliding_attention"))
      variants.push_back("dynamic+window");
    for (const std::string& name : variants) {
      SessionConfig sc;
      sc.cache.implementation = name == "dynamic+window" ? "dynamic" : name;
      sc.sliding_window_override = name == "dynamic+window" ? total : 0;
      sc.cache.kv_dtype = dt;
      sc.kernel = p.kernel;
      sc.cache.max_cache_len = total;
      Session s(model, sc);
      std::vector<int32_t> seq = prompt;
      std::vector<float> step_logits;  // [new_tokens, vocab]: logits that chose each new token
      step_logits.reserve(static_cast<size_t>(p.new_tokens) * vocab);
      std::span<const float> l = s.prefill(prompt);
      double decode_s = 0;
      for (int64_t i = 0; i < p.new_tokens; ++i) {
        step_logits.insert(step_logits.end(), l.begin(), l.end());
        const auto next = static_cast<int32_t>(argmax(l.data(), c.vocab_size));
        seq.push_back(next);
        if (i + 1 == p.new_tokens) break;
        const auto t0 = std::chrono::steady_clock::now();
        l = s.decode(next);
        decode_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      }
      // One no-cache forward over everything fed: row P-1+i predicted new token i.
      ForwardParams fp;
      fp.tokens = seq.data();
      fp.n_tokens = total - 1;
      fp.logits = LogitsMode::kAll;
      std::span<const float> all = oracle.forward(fp);
      ContainerRow r;
      r.cache = name;
      r.kv_dtype = dt;
      r.tokens = s.position();
      r.kv_bytes = s.kv_bytes();
      r.decode_tps = decode_s > 0 ? static_cast<double>(p.new_tokens - 1) / decode_s : 0.0;
      r.tolerance = verify_tolerance_for(dt);
      for (int64_t i = 0; i < p.new_tokens; ++i) {
        const size_t row = static_cast<size_t>(p.prompt_tokens - 1 + i);
        r.max_rel_diff = std::max(
            r.max_rel_diff,
            max_rel_diff({step_logits.data() + i * vocab, vocab}, all.subspan(row * vocab, vocab)));
      }
      const std::vector<int32_t> ids(seq.begin() + p.prompt_tokens, seq.end());
      auto [it, inserted] = first_ids.emplace(dt, ids);
      r.same_ids = inserted || it->second == ids;
      rows.push_back(r);
    }
  }
  return rows;
}

}  // namespace kvcache
