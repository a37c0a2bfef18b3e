// The paged cache's varlen contract under the real forward pass, for any model: dense sessions
// run one prompt at a time against one paged cache that prefills each prompt alone and then
// decodes all of them as one batch of rows at different positions. With the eager kernel both
// do the same arithmetic on the same keys, so their logits must agree bit for bit.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "golden_util.h"
#include "model/forward.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"

namespace kvcache::testing_util {

inline int32_t argmax_id(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Sample 0's ids, their logprobs and the top entries of every step of an engine request:
// equal only when the logits are.
inline std::vector<double> logprob_trace(const RequestOutput& out) {
  std::vector<double> t;
  for (const TokenLogprob& lp : out.samples.at(0).logprobs) {
    t.push_back(lp.chosen.token);
    t.push_back(lp.chosen.logprob);
    for (const LogprobEntry& e : lp.top) {
      t.push_back(e.token);
      t.push_back(e.logprob);
    }
  }
  return t;
}

struct PagedVsDense {
  std::vector<std::vector<int32_t>> prompts;  // one sequence each
  int decode_steps = 0;                       // greedy tokens after each prefill
  SessionConfig dense;                        // the reference: one session per prompt
  SessionConfig paged;                        // one cache for every sequence
  std::string note;                           // appended to failure messages
};

// Runs `c` and expects the paged logits to equal the dense ones bit for bit, and the store's
// invariants to hold. Returns the paged store, for checks of the caller's own; nullptr after a
// failure that ends the run (no paged store, no room for a step).
inline std::shared_ptr<PagedKVStore> expect_paged_equals_dense(const Model& model,
                                                               const PagedVsDense& c) {
  const auto B = static_cast<int64_t>(c.prompts.size());
  const auto V = static_cast<size_t>(model.config().vocab_size);
  // Dense reference: per sequence, the prefill logits then each greedy step's logits.
  std::vector<std::vector<std::vector<float>>> ref(static_cast<size_t>(B));
  std::vector<std::vector<int32_t>> next(static_cast<size_t>(B));
  for (int64_t i = 0; i < B; ++i) {
    Session s(model, c.dense);
    auto l = s.prefill(c.prompts[static_cast<size_t>(i)]);
    ref[static_cast<size_t>(i)].emplace_back(l.begin(), l.end());
    for (int t = 0; t < c.decode_steps; ++t) {
      const int32_t id = argmax_id(ref[static_cast<size_t>(i)].back());
      next[static_cast<size_t>(i)].push_back(id);
      l = s.decode(id);
      ref[static_cast<size_t>(i)].emplace_back(l.begin(), l.end());
    }
  }

  CacheConfig cc = make_cache_config(model.config(), c.paged);
  if (!cc.options.paged.store) {
    ADD_FAILURE() << "not a paged configuration" << c.note;
    return nullptr;
  }
  PagedKVStore& store = *cc.options.paged.store;
  Cache cache(cc);
  Forward fwd(model, "eager", 64);
  std::vector<SeqId> seqs;
  for (int64_t i = 0; i < B; ++i) {
    seqs.push_back(store.add_sequence());
    const SeqId one[] = {seqs.back()};
    store.set_batch(one);
    const auto& p = c.prompts[static_cast<size_t>(i)];
    if (store.plan_step(static_cast<int64_t>(p.size()), p) != StepStatus::kOk) {
      ADD_FAILURE() << "no room to prefill sequence " << i << c.note;
      return nullptr;
    }
    ForwardParams fp;
    fp.tokens = p.data();
    fp.n_tokens = static_cast<int64_t>(p.size());
    fp.cache = &cache;
    EXPECT_TRUE(bits_equal(fwd.forward(fp), ref[static_cast<size_t>(i)][0]))
        << "prefill of sequence " << i << c.note;
  }
  store.set_batch(seqs);
  std::vector<int64_t> pos;
  for (const auto& p : c.prompts) pos.push_back(static_cast<int64_t>(p.size()));
  for (int t = 0; t < c.decode_steps; ++t) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < B; ++i)
      ids.push_back(next[static_cast<size_t>(i)][static_cast<size_t>(t)]);
    if (store.plan_step(1, ids) != StepStatus::kOk) {
      ADD_FAILURE() << "no room for decode step " << t << c.note;
      return nullptr;
    }
    ForwardParams fp;
    fp.tokens = ids.data();
    fp.batch = B;
    fp.n_tokens = 1;
    fp.row_pos0 = pos.data();
    fp.cache = &cache;
    const auto l = fwd.forward(fp);
    for (int64_t i = 0; i < B; ++i) {
      const auto row = l.subspan(static_cast<size_t>(i) * V, V);
      const auto& want = ref[static_cast<size_t>(i)][static_cast<size_t>(t + 1)];
      EXPECT_TRUE(bits_equal(row, want))
          << "decode step " << t << " of sequence " << i << ", relative difference "
          << max_rel_diff(row, want) << c.note;
      ++pos[static_cast<size_t>(i)];
    }
  }
  EXPECT_EQ(store.check_invariants(), "") << c.note;
  return cc.options.paged.store;
}

}  // namespace kvcache::testing_util
