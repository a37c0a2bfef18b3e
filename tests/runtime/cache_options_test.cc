// The cache options a SessionConfig or an EngineConfig carries (CacheOptions) reach the
// containers: a container family's own struct arrives whole, the common options where they
// apply, and what the runtime builds itself or cannot honour is refused rather than ignored.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cache/paged_store.h"
#include "cache/quantized_layer.h"
#include "core/error.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "tiny_model.h"

namespace kvcache {
namespace {

const Model& tiny() {
  return *testing_util::tiny_model().model;
}

std::vector<int32_t> ids(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1);
  return v;
}

TEST(CacheOptions, QuantizedOptionsReachEveryQuantizedLayer) {
  SessionConfig sc;
  sc.cache.implementation = "quantized";
  sc.cache.quantized = {.scheme = KVQuantScheme::kKivi, .bits = 2, .group = 16, .residual = 24};
  Session s(tiny(), sc);
  s.prefill(ids(40));
  // 40 residual tokens >= max(R, G) = 24: the next update packs 32 (two groups of 16) and keeps
  // 8 + 1. The defaults (G 64, R 128) would pack nothing and keep all 41.
  s.decode(7);
  for (int l = 0; l < s.cache().num_layers(); ++l) {
    const KVSpan span = s.cache().shared_kv(l);
    ASSERT_EQ(span.kind, KVSpanKind::kQuantized) << "layer " << l;
    EXPECT_EQ(span.quant.scheme, KVQuantScheme::kKivi) << "layer " << l;
    EXPECT_EQ(span.quant.bits, 2) << "layer " << l;
    EXPECT_EQ(span.quant.group, 16) << "layer " << l;
    const auto& q = dynamic_cast<const QuantizedLayer&>(s.cache().layer(l));
    EXPECT_EQ(q.packed_length(), 32) << "layer " << l;
    EXPECT_EQ(q.residual_length(), 9) << "layer " << l;
  }
  // The scheme arrives as well: tiny's 16-wide heads are too narrow for llama.cpp's blocks of
  // 32 channels, which the layer says at its first update.
  sc.cache.quantized.scheme = KVQuantScheme::kQ8_0;
  sc.cache.quantized.bits = 8;
  Session q8(tiny(), sc);
  try {
    q8.prefill(ids(3));
    ADD_FAILURE() << "q8_0 on 16-wide heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_0"), std::string::npos) << e.what();
  }
}

TEST(CacheOptions, PagedOptionsReachTheSessionsStore) {
  SessionConfig sc;
  sc.cache.implementation = "paged";
  sc.cache.paged.block_tokens = 5;
  sc.cache.kv_dtype = DType::kF16;
  Session s(tiny(), sc);
  ASSERT_NE(s.paged_store(), nullptr);
  EXPECT_EQ(s.paged_store()->block_tokens(), 5);
  EXPECT_EQ(s.paged_store()->config().dtype, DType::kF16);
  s.prefill(ids(12));
  EXPECT_EQ(s.cache().shared_kv(0).paged.block_tokens, 5);
  EXPECT_EQ(s.paged_store()->stats(0).allocated_slots, 15);  // three blocks of 5
}

TEST(CacheOptions, EngineTakesTheSameOptions) {
  EngineConfig ec;
  ec.cache.paged.block_tokens = 4;
  ec.cache.kv_dtype = DType::kF16;
  ec.cache.max_cache_len = 64;  // without a budget: the pool's tokens
  Engine e(tiny(), nullptr, ec);
  EXPECT_EQ(e.store().block_tokens(), 4);
  EXPECT_EQ(e.store().config().dtype, DType::kF16);
  EXPECT_EQ(e.store().config().max_tokens, 64);
}

TEST(CacheOptions, WhatTheRuntimeBuildsOrCannotHonourIsRefused) {
  SessionConfig two_rows;
  two_rows.cache.max_batch_size = 2;  // a session holds one sequence
  EXPECT_THROW((Session{tiny(), two_rows}), Error);
  SessionConfig own_store;
  own_store.cache.implementation = "paged";
  PagedStoreConfig psc;
  psc.layer_types = tiny().config().layer_types;
  psc.max_tokens = 64;
  own_store.cache.paged.store = std::make_shared<PagedKVStore>(psc);  // the session plans its own
  EXPECT_THROW((Session{tiny(), own_store}), Error);

  EngineConfig dense;
  dense.cache.implementation = "dynamic";  // the engine serves from paged blocks only
  EXPECT_THROW((Engine{tiny(), nullptr, dense}), Error);
  EngineConfig rows;
  rows.cache.max_batch_size = 8;  // max_running is the engine's batch
  EXPECT_THROW((Engine{tiny(), nullptr, rows}), Error);
}

}  // namespace
}  // namespace kvcache
