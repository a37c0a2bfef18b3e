#include "core/digest.h"

#include <gtest/gtest.h>

#include <string>

namespace kvcache {
namespace {

TEST(Digest, KnownBlake2b128Vector) {
  // BLAKE2b with a 16-byte digest of "abc" (RFC 7693's algorithm, outlen 16), as b2sum -l 128.
  const Digest128 d = digest128("abc", 3);
  EXPECT_EQ(d.hex(), "cf4ab791c62b8d2b2109c90275287816");
}

TEST(Digest, HexRoundTripAndRejectsBadText) {
  const Digest128 d = Hasher().str("kvcache").u64(42).finish();
  Digest128 back;
  ASSERT_TRUE(Digest128::from_hex(d.hex(), back));
  EXPECT_EQ(back, d);
  EXPECT_FALSE(Digest128::from_hex("xyz", back));
  EXPECT_FALSE(Digest128::from_hex(std::string(32, 'G'), back));
}

TEST(Digest, FieldsAreFramedSoShiftedBytesDiffer) {
  EXPECT_NE(Hasher().str("ab").str("c").finish(), Hasher().str("a").str("bc").finish());
  EXPECT_NE(Hasher().u32(1).finish(), Hasher().u64(1).finish());
  // finish() does not end the hasher.
  Hasher h;
  h.str("x");
  const Digest128 first = h.finish();
  EXPECT_EQ(h.finish(), first);
  h.str("y");
  EXPECT_NE(h.finish(), first);
}

}  // namespace
}  // namespace kvcache
