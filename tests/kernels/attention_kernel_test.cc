// AttentionKernel, the model's one attention call: each span kind reaches the kernel that reads
// it with the offsets the positions imply (bit-identical to calling that kernel directly), a
// kind the named kernel cannot read is refused naming both, and a span that does not end with
// its queries' keys is an error rather than a silently misplaced mask.
#include "kernels/attention_kernel.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/paged_attention.h"

namespace kvcache {
namespace {

constexpr int64_t kB = 2, kH = 4, kHkv = 2, kD = 64, kS = 3;

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  Tensor t = Tensor::empty(DType::kF32, shape);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = nd(rng);
  return t;
}

// Queries as the model lays them out: row-major [B*S, H*D] viewed as [B, H, S, D].
TensorView rows_view(const Tensor& t, int64_t S) {
  return TensorView(t.data(), DType::kF32, {kB, kH, S, kD}, {S * kH * kD, kD, kH * kD, 1});
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

AttentionOptions options() {
  AttentionOptions o;
  o.sliding_window = 5;
  return o;
}

TEST(AttentionKernel, DenseSpanIsTheNamedKernelAtTheQueriesPositions) {
  const int64_t Skv = 11, pos0 = Skv - kS;
  const Tensor q = random_tensor({kB * kS, kH * kD}, 1), k = random_tensor({kB, kHkv, Skv, kD}, 2),
               v = random_tensor({kB, kHkv, Skv, kD}, 3);
  for (const char* name : {"eager", "fused", "flex"}) {
    KVSpan span;
    span.k = k.view();
    span.v = v.view();
    Tensor got = Tensor::zeros(DType::kF32, {kB * kS, kH * kD}),
           want = Tensor::zeros(DType::kF32, {kB * kS, kH * kD});
    AttentionKernel kernel(name);
    kernel.attend(rows_view(q, kS), span, rows_view(got, kS), options(),
                  QueryPositions{pos0, nullptr, 0});
    AttentionOptions o = options();
    o.q_offset = pos0;
    get_attention_kernel(name)(rows_view(q, kS), k.view(), v.view(), rows_view(want, kS), o);
    EXPECT_TRUE(same_bits(got, want)) << name;
    // The last query of each row alone: the bits it has in the whole call.
    Tensor last = Tensor::zeros(DType::kF32, {kB, kH * kD});
    const TensorView last_view(last.data(), DType::kF32, {kB, kH, 1, kD},
                               {kH * kD, kD, kH * kD, 1});
    kernel.attend_last(rows_view(q, kS), span, rows_view(got, kS), last_view, options(),
                       QueryPositions{pos0, nullptr, 0});
    for (int64_t b = 0; b < kB; ++b)
      EXPECT_EQ(
          std::memcmp(last.data_as<float>() + b * kH * kD,
                      want.data_as<float>() + (b * kS + kS - 1) * kH * kD, kH * kD * sizeof(float)),
          0)
          << name << " row " << b;
  }
}

// Two sequences at different positions, one page each (page ids 1 and 0 of a 3-page pool).
struct PagedSpan {
  Tensor kpool = random_tensor({3, kHkv, 16, kD}, 4), vpool = random_tensor({3, kHkv, 16, kD}, 5);
  std::vector<int32_t> indptr = {0, 1, 2}, indices = {1, 0}, last = {9, 14};
  std::vector<int64_t> pos = {9 - kS, 14 - kS};  // each row's queries end with its keys
  KVSpan span() const {
    KVSpan s;
    s.kind = KVSpanKind::kPaged;
    s.paged.k_pages = kpool.view();
    s.paged.v_pages = vpool.view();
    s.paged.batch = kB;
    s.paged.block_tokens = 16;
    s.paged.indptr = indptr.data();
    s.paged.indices = indices.data();
    s.paged.last_page_len = last.data();
    return s;
  }
};

TEST(AttentionKernel, PagedSpanGoesToPagedAttentionUnderTheSameName) {
  const PagedSpan p;
  const Tensor q = random_tensor({kB * kS, kH * kD}, 6);
  for (const char* name : {"eager", "fused"}) {
    Tensor got = Tensor::zeros(DType::kF32, {kB * kS, kH * kD}),
           want = Tensor::zeros(DType::kF32, {kB * kS, kH * kD});
    AttentionKernel kernel(name);
    EXPECT_TRUE(kernel.reads(KVSpanKind::kPaged));
    kernel.attend(rows_view(q, kS), p.span(), rows_view(got, kS), options(),
                  QueryPositions{0, p.pos.data(), 0});
    const int32_t cu[] = {0, kS, 2 * kS};
    PagedAttentionArgs a;
    a.q = TensorView(q.data(), DType::kF32, {kB * kS, kH, kD});
    a.out = TensorView(want.data(), DType::kF32, {kB * kS, kH, kD});
    a.kv = p.span().paged;
    a.cu_seqlens_q = cu;
    paged_attention(name, a, options());
    EXPECT_TRUE(same_bits(got, want)) << name;
  }
}

TEST(AttentionKernel, RefusesASpanKindItCannotReadNamingBoth) {
  const PagedSpan p;
  const Tensor q = random_tensor({kB * kS, kH * kD}, 7);
  Tensor out = Tensor::zeros(DType::kF32, {kB * kS, kH * kD});
  AttentionKernel flex("flex");
  EXPECT_FALSE(flex.reads(KVSpanKind::kPaged));
  EXPECT_TRUE(flex.reads(KVSpanKind::kDense) && flex.reads(KVSpanKind::kQuantized));
  try {
    flex.attend(rows_view(q, kS), p.span(), rows_view(out, kS), options(),
                QueryPositions{0, p.pos.data(), 0});
    FAIL() << "flex read a paged span";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(msg.find("'flex'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("paged"), std::string::npos) << msg;
    EXPECT_NE(msg.find("eager, fused"), std::string::npos) << msg;
  }
  EXPECT_THROW(AttentionKernel("no_such_kernel"), Error);
}

TEST(AttentionKernel, ASpanThatDoesNotEndWithItsQueriesIsAnError) {
  const int64_t Skv = 8;
  const Tensor q = random_tensor({kB * kS, kH * kD}, 8), k = random_tensor({kB, kHkv, Skv, kD}, 9),
               v = random_tensor({kB, kHkv, Skv, kD}, 10);
  Tensor out = Tensor::zeros(DType::kF32, {kB * kS, kH * kD});
  KVSpan span;
  span.k = k.view();
  span.v = v.view();
  AttentionKernel kernel("fused");
  // Queries past the keys (a recompute cache asked for a chunk that does not start at 0), and
  // before them.
  for (const int64_t pos0 : {Skv, int64_t{0}}) {
    try {
      kernel.attend(rows_view(q, kS), span, rows_view(out, kS), options(),
                    QueryPositions{pos0, nullptr, 0});
      FAIL() << "queries at " << pos0 << " served by keys [0, " << Skv << ")";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("end at position"), std::string::npos) << e.what();
    }
  }
  // Rows at different positions share no dense span.
  const int64_t pos[] = {Skv - kS, Skv - kS - 1};
  EXPECT_THROW(kernel.attend(rows_view(q, kS), span, rows_view(out, kS), options(),
                             QueryPositions{0, pos, 0}),
               Error);
  // A paged sequence whose keys end elsewhere than its queries.
  PagedSpan p;
  p.pos[1] += 1;
  EXPECT_THROW(kernel.attend(rows_view(q, kS), p.span(), rows_view(out, kS), options(),
                             QueryPositions{0, p.pos.data(), 0}),
               Error);
}

}  // namespace
}  // namespace kvcache
