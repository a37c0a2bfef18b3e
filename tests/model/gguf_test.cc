#include "model/gguf.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "model/kv_plan.h"
#include "model_test_util.h"

namespace kvcache {
namespace {

using namespace testing_util;  // model_test_util.h

TEST(Gguf, MetadataOfEveryTypeRoundTrips) {
  GgufWriter w(64);
  GgufValue u8;
  u8.type = GgufType::kUint8;
  u8.u = 250;
  u8.i = 250;
  GgufValue i8;
  i8.type = GgufType::kInt8;
  i8.i = -100;
  GgufValue u16;
  u16.type = GgufType::kUint16;
  u16.u = 65000;
  u16.i = 65000;
  GgufValue i16;
  i16.type = GgufType::kInt16;
  i16.i = -30000;
  GgufValue i64;
  i64.type = GgufType::kInt64;
  i64.i = -(int64_t{1} << 40);
  GgufValue f64;
  f64.type = GgufType::kFloat64;
  f64.f = 0.1;
  GgufValue nested;
  nested.type = GgufType::kArray;
  nested.array_type = GgufType::kArray;
  nested.items = {GgufValue::i32_array({1, 2}), GgufValue::str_array({"x"})};
  w.set("a.u8", u8);
  w.set("a.i8", i8);
  w.set("a.u16", u16);
  w.set("a.i16", i16);
  w.set("a.u32", GgufValue::u32(4000000000u));
  w.set("a.i32", GgufValue::i32(-5));
  w.set("a.u64", GgufValue::u64(uint64_t{1} << 50));
  w.set("a.i64", i64);
  w.set("a.f32", GgufValue::f32(1.5f));
  w.set("a.f64", f64);
  w.set("a.bool", GgufValue::boolean(true));
  w.set("a.str", GgufValue::str(std::string("h\xc3\xa9llo\0x", 8)));
  w.set("a.strs", GgufValue::str_array({"", "a", "\xe2\x96\x81"}));
  w.set("a.f32s", GgufValue::f32_array({0.25f, -3.0f}));
  w.set("a.i32s", GgufValue::i32_array({-1, 7}));
  w.set("a.nested", nested);
  const std::string p = temp_path("meta.gguf");
  w.write(p);
  auto g = GgufFile::open(p);
  EXPECT_EQ(g->version(), 3u);
  EXPECT_EQ(g->alignment(), 64u);
  EXPECT_EQ(g->data_offset() % 64, 0u);
  EXPECT_EQ(g->metadata().size(), 17u);  // + general.alignment
  EXPECT_EQ(g->get_int("a.u8"), 250);
  EXPECT_EQ(g->get_int("a.i8"), -100);
  EXPECT_EQ(g->get_int("a.u16"), 65000);
  EXPECT_EQ(g->get_int("a.i16"), -30000);
  EXPECT_EQ(g->get_int("a.u32"), 4000000000);
  EXPECT_EQ(g->get_int("a.i32"), -5);
  EXPECT_EQ(g->get_int("a.u64"), int64_t{1} << 50);
  EXPECT_EQ(g->get_int("a.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(g->get_float("a.f32"), 1.5);
  EXPECT_EQ(g->get_float("a.f64"), 0.1);
  EXPECT_TRUE(g->get_bool_or("a.bool", false));
  EXPECT_EQ(g->get_string("a.str"), std::string("h\xc3\xa9llo\0x", 8));
  EXPECT_EQ(g->get_array("a.strs", GgufType::kString).strs,
            (std::vector<std::string>{"", "a", "\xe2\x96\x81"}));
  EXPECT_EQ(g->get_array("a.f32s", GgufType::kFloat32).floats, (std::vector<double>{0.25, -3.0}));
  EXPECT_EQ(g->get_array("a.i32s", GgufType::kInt32).ints, (std::vector<int64_t>{-1, 7}));
  const GgufValue& n = g->get_array("a.nested", GgufType::kArray);
  ASSERT_EQ(n.items.size(), 2u);
  EXPECT_EQ(n.items[0].ints, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(n.items[1].strs, (std::vector<std::string>{"x"}));
  EXPECT_EQ(g->get_int_or("absent", 9), 9);
  expect_error([&] { g->get_int("absent.key"); }, {p, "absent.key", "missing"});
  expect_error([&] { g->get_string("a.u8"); }, {p, "a.u8", "uint8"});
  std::filesystem::remove(p);
}

TEST(Gguf, TensorsOfEachDtypeKeepBytesAndReverseShape) {
  for (uint32_t align : {32u, 64u}) {
    std::vector<Tensor> ts;
    ts.push_back(Tensor::empty(DType::kF32, {3, 5}));
    ts.push_back(Tensor::empty(DType::kF16, {7}));
    ts.push_back(Tensor::empty(DType::kBF16, {2, 3, 5}));
    ts.push_back(Tensor::empty(DType::kQ8_0, {3, 64}));
    GgufWriter w(align);
    std::mt19937 rng(1);
    for (size_t i = 0; i < ts.size(); ++i) {
      auto* b = ts[i].data_as<uint8_t>();
      for (size_t k = 0; k < ts[i].size_bytes(); ++k) b[k] = static_cast<uint8_t>(rng());
      w.add_tensor("t" + std::to_string(i), ts[i].view());
    }
    const std::string p = temp_path("tensors.gguf");
    w.write(p);
    auto g = GgufFile::open(p);
    ASSERT_EQ(g->tensor_infos().size(), ts.size());
    EXPECT_EQ(g->tensor_infos()[0].ne, (std::vector<uint64_t>{5, 3}));  // fastest first
    for (size_t i = 0; i < ts.size(); ++i) {
      const GgufTensorInfo* info = g->find_tensor("t" + std::to_string(i));
      ASSERT_NE(info, nullptr);
      EXPECT_EQ(info->offset % align, 0u);
      const TensorView v = g->tensor_view(*info);
      EXPECT_EQ(v.dtype(), ts[i].dtype());
      EXPECT_EQ(v.shape(), ts[i].shape());
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % align, 0u) << "tensor data must be aligned";
      EXPECT_EQ(std::memcmp(v.data(), ts[i].data(), ts[i].size_bytes()), 0);
    }
    std::filesystem::remove(p);
  }
}

TEST(Gguf, LlamaModelRoundTripsThroughConfig) {
  ModelConfig c = tiny_config();
  c.rope_theta = 500000.0f;
  c.rms_eps = 1e-6f;
  c.max_seq_len = 4096;
  c.tie_word_embeddings = true;
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
    auto w = tiny_weights(c, dt);
    GgufWriter gw;
    gguf_write_llama_config(gw, c);
    for (const auto& [n, v] : w.views()) gw.add_tensor(n, v);
    const std::string p = temp_path("llama.gguf");
    gw.write(p);
    auto m = open_model_file(p);
    EXPECT_EQ(m->format(), "gguf");
    const ModelConfig& r = m->config();
    EXPECT_EQ(r.architecture, "llama");
    EXPECT_EQ(r.dim, c.dim);
    EXPECT_EQ(r.n_layers, c.n_layers);
    EXPECT_EQ(r.n_heads, c.n_heads);
    EXPECT_EQ(r.n_kv_heads, c.n_kv_heads);
    EXPECT_EQ(r.head_dim, c.head_dim);
    EXPECT_EQ(r.hidden_dim, c.hidden_dim);
    EXPECT_EQ(r.vocab_size, c.vocab_size);
    EXPECT_EQ(r.max_seq_len, 4096);
    EXPECT_EQ(r.rope_theta, 500000.0f);
    EXPECT_EQ(r.rms_eps, 1e-6f);
    EXPECT_TRUE(r.tie_word_embeddings);
    EXPECT_TRUE(r.rope_interleaved);
    EXPECT_FALSE(r.qkv_bias);
    EXPECT_EQ(r.bos_id, 1);
    EXPECT_EQ(r.eos_id, 2);
    EXPECT_EQ(r.layer_types, (std::vector<std::string>(2, "full_attention")));
    EXPECT_EQ(m->tensors().size(), w.tensors.size());
    for (const auto& [n, t] : w.tensors) {
      const TensorView& v = m->tensor(n);
      EXPECT_EQ(v.shape(), t.shape()) << n;
      EXPECT_EQ(v.dtype(), t.dtype()) << n;
      EXPECT_EQ(std::memcmp(v.data(), t.data(), t.size_bytes()), 0) << n;
    }
    std::filesystem::remove(p);
  }
}

TEST(Gguf, RopeFreqsTensorBecomesFreqFactorsAndLinearScalingIsFolded) {
  ModelConfig c = tiny_config();
  auto w = tiny_weights(c, DType::kF32);
  Tensor rf = Tensor::empty(DType::kF32, {c.head_dim / 2});
  for (int64_t i = 0; i < rf.numel(); ++i) rf.data_as<float>()[i] = 1.0f + static_cast<float>(i);
  GgufWriter gw;
  gguf_write_llama_config(gw, c);
  for (const auto& [n, v] : w.views()) gw.add_tensor(n, v);
  gw.add_tensor("rope_freqs.weight", rf.view());
  const std::string p = temp_path("rf.gguf");
  gw.write(p);
  auto m = load_gguf_model(p);
  ASSERT_EQ(m->config().rope_freq_factors.size(), 8u);
  EXPECT_EQ(m->config().rope_freq_factors[7], 8.0f);
  EXPECT_EQ(m->config().rope_scaling.type, RopeScalingType::kLlama3);

  ModelConfig lin = c;
  lin.rope_scaling.type = RopeScalingType::kLinear;
  lin.rope_scaling.factor = 4.0f;
  GgufWriter gw2;
  gguf_write_llama_config(gw2, lin);
  for (const auto& [n, v] : w.views()) gw2.add_tensor(n, v);
  gw2.write(p);
  auto m2 = load_gguf_model(p);
  EXPECT_EQ(m2->config().rope_scaling.type, RopeScalingType::kLinear);
  EXPECT_EQ(m2->config().rope_freq_factors, std::vector<float>(8, 4.0f));
  std::filesystem::remove(p);
}

class GgufBadFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    c_ = tiny_config();
    w_ = tiny_weights(c_, DType::kF16);
    GgufWriter gw;
    gguf_write_llama_config(gw, c_);
    for (const auto& [n, v] : w_.views()) gw.add_tensor(n, v);
    gw.write(good_);
    bytes_ = read_file(good_);
  }
  void TearDown() override {
    std::filesystem::remove(good_);
    std::filesystem::remove(bad_);
  }
  ModelConfig c_;
  testing_util::TinyWeights w_;
  std::string good_ = temp_path("good.gguf");
  std::string bad_ = temp_path("bad.gguf");
  std::string bytes_;
};

TEST_F(GgufBadFiles, WrongMagic) {
  std::string b = bytes_;
  b[0] = 'X';
  write_file(bad_, b);
  expect_error([&] { load_gguf_model(bad_); }, {bad_, "magic", "XGUF"});
}

TEST_F(GgufBadFiles, WrongVersion) {
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    std::string b = bytes_;
    std::memcpy(b.data() + 4, &v, 4);
    write_file(bad_, b);
    expect_error([&] { load_gguf_model(bad_); }, {bad_, "version " + std::to_string(v)});
  }
}

TEST_F(GgufBadFiles, TruncatedAnywhereIsAFormatErrorNeverACrash) {
  // Cut in the header, the metadata, the tensor infos and the data.
  for (size_t cut : {size_t{0}, size_t{3}, size_t{10}, size_t{30}, size_t{200}, bytes_.size() / 4,
                     bytes_.size() / 2, bytes_.size() - 1}) {
    write_file(bad_, bytes_.substr(0, cut));
    try {
      load_gguf_model(bad_);
      ADD_FAILURE() << "cut at " << cut << " loaded";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kFormat) << e.what();
      EXPECT_NE(std::string(e.what()).find(bad_), std::string::npos) << e.what();
    }
  }
  write_file(bad_, bytes_.substr(0, bytes_.size() - 1));
  expect_error([&] { load_gguf_model(bad_); }, {"output.weight", "outside the file"});
}

TEST_F(GgufBadFiles, TensorOutOfBounds) {
  // Patch the data offset of the last tensor info (output.weight) far beyond the end.
  auto g = GgufFile::open(good_);
  const GgufTensorInfo& last = g->tensor_infos().back();
  ASSERT_EQ(last.name, "output.weight");
  // The offset is the 8 bytes just before the aligned data section's padding; find it by value.
  std::string b = bytes_;
  const uint64_t old_off = last.offset, new_off = uint64_t{1} << 30;
  size_t pos = b.rfind(std::string(reinterpret_cast<const char*>(&old_off), 8), g->data_offset());
  ASSERT_NE(pos, std::string::npos);
  std::memcpy(b.data() + pos, &new_off, 8);
  write_file(bad_, b);
  expect_error([&] { load_gguf_model(bad_); }, {bad_, "output.weight", "outside the file"});
}

TEST_F(GgufBadFiles, UnsupportedDtypeNamesTensorAndType) {
  auto g = GgufFile::open(good_);
  const GgufTensorInfo& last = g->tensor_infos().back();
  std::string b = bytes_;
  // type field precedes the offset field: patch f16 (1) -> iq2_xxs (16), which kvcache has no
  // kernels for.
  const uint64_t off = last.offset;
  size_t pos = b.rfind(std::string(reinterpret_cast<const char*>(&off), 8), g->data_offset());
  ASSERT_NE(pos, std::string::npos);
  const uint32_t iq2 = 16;
  std::memcpy(b.data() + pos - 4, &iq2, 4);
  write_file(bad_, b);
  auto g2 = GgufFile::open(bad_);  // metadata stays readable
  EXPECT_EQ(g2->find_tensor("output.weight")->ggml_type, 16u);
  try {
    load_gguf_model(bad_);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    for (const char* n : {"output.weight", "iq2_xxs"})
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST_F(GgufBadFiles, ShapeMismatchWithConfig) {
  ModelConfig c = c_;
  c.hidden_dim = 128;  // the file's ffn tensors are 96 wide
  GgufWriter gw;
  gguf_write_llama_config(gw, c);
  for (const auto& [n, v] : w_.views()) gw.add_tensor(n, v);
  gw.write(bad_);
  expect_error([&] { load_gguf_model(bad_); },
               {bad_, "blk.0.ffn_gate.weight", "[96, 64]", "[128, 64]"});
}

TEST_F(GgufBadFiles, MissingTensorAndMissingMetadata) {
  GgufWriter gw;
  gguf_write_llama_config(gw, c_);
  for (const auto& [n, v] : w_.views())
    if (n != "blk.1.attn_v.weight") gw.add_tensor(n, v);
  gw.write(bad_);
  expect_error([&] { load_gguf_model(bad_); }, {bad_, "missing tensor 'blk.1.attn_v.weight'"});
  GgufWriter gw2;
  gguf_write_llama_config(gw2, c_);
  gw2.set("llama.block_count", GgufValue::str("two"));
  gw2.write(bad_);
  expect_error([&] { load_gguf_model(bad_); }, {bad_, "llama.block_count", "string"});
}

// A 16 KB fuzzed GGUF whose block_count was 2^32 - 1 made the loader size 137 GB of layer types
// before anything failed. Every count is checked against config_limits.h under its GGUF name
// as it is read: the answer is an Error naming the key (std::bad_alloc before the check).
TEST_F(GgufBadFiles, HostileCountsAreRefusedBeforeAnyAllocation) {
  const std::pair<const char*, uint32_t> kHostile[] = {
      {"llama.block_count", 0xFFFFFFFFu},
      {"llama.embedding_length", 0x40000000u},
      {"llama.attention.head_count", 1u << 20},
      {"llama.attention.head_count_kv", 1u << 20},
      {"llama.attention.key_length", 0x7FFFFFFFu},
      {"llama.feed_forward_length", 0xFFFFFFF0u},
      {"llama.context_length", 0xFFFFFFFFu},
      {"llama.vocab_size", 0x7FFFFFFFu},
      {"llama.attention.sliding_window", 0xFFFFFFFFu}};
  for (const auto& [key, value] : kHostile) {
    GgufWriter gw;
    gguf_write_llama_config(gw, c_);
    gw.set(key, GgufValue::u32(value));
    for (const auto& [n, v] : w_.views()) gw.add_tensor(n, v);
    gw.write(bad_);
    expect_error([&] { load_gguf_model(bad_); }, {bad_, key, std::to_string(value), "maximum"});
  }
  // The planner's GGUF reader divides by the head count: 0 was a SIGFPE.
  GgufWriter gw;
  gguf_write_llama_config(gw, c_);
  gw.set("llama.attention.head_count", GgufValue::u32(0));
  gw.write(bad_);
  EXPECT_THROW(plan_model_from_gguf(bad_), Error);
  GgufWriter gw2;
  gguf_write_llama_config(gw2, c_);
  gw2.set("llama.block_count", GgufValue::u64(uint64_t{1} << 40));
  gw2.write(bad_);
  expect_error([&] { plan_model_from_gguf(bad_); }, {bad_, "llama.block_count", "4096"});
}

TEST(Gguf, ParsesFromMemoryLikeFromAFile) {
  const ModelConfig c = tiny_config();
  const testing_util::TinyWeights w = tiny_weights(c, DType::kF32);
  GgufWriter gw;
  gguf_write_llama_config(gw, c);
  for (const auto& [n, v] : w.views()) gw.add_tensor(n, v);
  const std::string p = temp_path("memory.gguf");
  gw.write(p);
  const std::string bytes = read_file(p);
  std::filesystem::remove(p);
  const std::unique_ptr<ModelFile> m =
      load_gguf_model(GgufFile::open(MappedFile::copy_of("in-memory.gguf", bytes)));
  EXPECT_EQ(m->config().n_layers, c.n_layers);
  EXPECT_EQ(m->path(), "in-memory.gguf");
  try {
    GgufFile::open(MappedFile::copy_of("cut.gguf", bytes.substr(0, 100)));
    ADD_FAILURE() << "a truncated copy parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cut.gguf"), std::string::npos) << e.what();
  }
}

TEST(Gguf, HalfSplitConfigIsRefusedByTheLlamaWriter) {
  ModelConfig c = tiny_config();
  c.rope_interleaved = false;
  GgufWriter w;
  EXPECT_THROW(gguf_write_llama_config(w, c), Error);
}

}  // namespace
}  // namespace kvcache
