// Core: dtype conversions (bf16 round-to-nearest-even, f16), their vector paths, tensor views, parallel loops.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/aligned.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/parallel.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace lt {
namespace {

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Bf16, RoundsToNearestEven) {
  // 1.0 + half an ulp of bf16 (2^-8) ties: the even neighbour (1.0) wins.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // Just above the tie rounds up; 0x3f818000 ties between 0x3f81 (odd) and 0x3f82: up to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  EXPECT_EQ(f32_to_bf16(-1.0f), 0xbf80);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  // The largest finite float rounds up to +inf, as torch does.
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  // NaN stays NaN (quiet), sign kept.
  uint16_t nan = f32_to_bf16(from_bits(0x7f800001u));
  EXPECT_TRUE(std::isnan(bf16_to_f32(nan)));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0xffc00000u)))));
  // A subnormal float rounds like any other value.
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000u)), 0x0000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000u)), 0x0002);
}

TEST(Bf16, ScalarMatchesExactRoundingOnRandomValues) {
  // Reference: pick the nearer of the two bf16 neighbours in double, ties to the even code.
  Rng rng(1);
  for (int i = 0; i < 200000; ++i) {
    float f = from_bits(uint32_t(rng.next_u64()));
    if (std::isnan(f) || std::isinf(f)) continue;
    uint32_t b = bits(f);
    uint16_t lo = uint16_t(b >> 16);
    uint16_t hi = uint16_t(lo + 1);
    double dlo = bf16_to_f32(lo), dhi = bf16_to_f32(hi);
    if (std::isinf(dhi)) dhi = std::copysign(std::ldexp(1.0, 128), dlo);  // next step past max
    double dist_lo = std::fabs(double(f) - dlo), dist_hi = std::fabs(double(f) - dhi);
    uint16_t expect = dist_lo < dist_hi ? lo : dist_hi < dist_lo ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(f32_to_bf16(f), expect) << std::hex << b;
  }
}

class VectorPaths : public ::testing::Test {
 protected:
  void TearDown() override { cpu_features_override(nullptr); }
};

// Every path this CPU has (AVX-512, AVX2, plain) gives the scalar functions' bits, NaN codes included.
TEST_F(VectorPaths, Bf16ConversionsMatchScalar) {
  // Odd length (not a multiple of 8 or 16), special values sprinkled in.
  Rng rng(2);
  std::vector<float> src(1037);
  for (auto& x : src) x = from_bits(uint32_t(rng.next_u64()));
  src[3] = std::numeric_limits<float>::quiet_NaN();
  src[17] = -std::numeric_limits<float>::infinity();
  src[40] = from_bits(0x3f808000u);
  src[41] = from_bits(0x7f800001u);  // a signalling NaN whose payload is all in the low half
  src[42] = from_bits(0x00008000u);  // a subnormal tie
  src[43] = std::numeric_limits<float>::max();
  std::vector<uint16_t> expect(src.size());
  for (size_t i = 0; i < src.size(); ++i) expect[i] = f32_to_bf16(src[i]);

  const CpuFeatures probed = cpu_features();
  std::vector<CpuFeatures> paths;
  if (probed.avx512f && probed.avx512bw) paths.push_back(probed);
  if (probed.avx2) paths.push_back(cap_features(probed, IsaLevel::avx2));
  paths.push_back(CpuFeatures{});
  for (const CpuFeatures& p : paths) {
    SCOPED_TRACE(std::string(isa_name(isa_level(p))) + " path");
    cpu_features_override(&p);
    std::vector<uint16_t> got(src.size());
    convert_f32_to_bf16(got.data(), src.data(), src.size());
    for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(got[i], expect[i]) << "element " << i;
    std::vector<float> back(src.size());
    convert_bf16_to_f32(back.data(), got.data(), got.size());
    for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(bits(back[i]), uint32_t(got[i]) << 16) << "element " << i;
  }
}

TEST(F16, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), uint16_t(h)) << std::hex << h;
  }
}

TEST(F16, MatchesCompilerConversion) {
  // GCC's _Float16 conversion (IEEE round-to-nearest-even) is the reference.
  Rng rng(3);
  for (int i = 0; i < 200000; ++i) {
    float f = float(rng.normal() * std::ldexp(1.0, int(rng.below(40)) - 24));
    _Float16 h = static_cast<_Float16>(f);
    uint16_t hb;
    std::memcpy(&hb, &h, 2);
    ASSERT_EQ(f32_to_f16(f), hb) << f;
    ASSERT_EQ(f16_to_f32(hb), static_cast<float>(h));
  }
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // rounds past the largest half (65504): inf
  EXPECT_EQ(f32_to_f16(65519.f), 0x7bff);
}

TEST(DType, ParseAndNames) {
  EXPECT_EQ(dtype_parse("BF16"), DType::bf16);
  EXPECT_EQ(dtype_parse("f32"), DType::f32);
  EXPECT_EQ(dtype_size(DType::i64), 8u);
  EXPECT_EQ(dtype_safetensors_name(DType::f16), "F16");
  EXPECT_THROW(dtype_parse("F64"), Error);
}

TEST(TensorView, CheckedAccess) {
  std::vector<float> data(2 * 3 * 5);
  for (size_t i = 0; i < data.size(); ++i) data[i] = float(i) + 0.5f;
  TensorView v = TensorView::contiguous(data.data(), DType::f32, {2, 3, 5});
  EXPECT_TRUE(v.is_contiguous());
  EXPECT_EQ(v.numel(), 30);
  EXPECT_EQ(v.get({1, 2, 4}), 29.5f);
  v.set({0, 1, 0}, -1.f);
  EXPECT_EQ(data[5], -1.f);
  EXPECT_THROW(v.get({2, 0, 0}), Error);
  EXPECT_THROW(v.get({0, 0}), Error);
  EXPECT_THROW(v.ptr<uint16_t>(), Error);
  try {
    v.get({0, 3, 0});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[2, 3, 5]"), std::string::npos) << e.what();
    EXPECT_NE(e.where().find("tensor.cpp"), std::string::npos);
  }
}

TEST(Parallel, EveryTaskRunsOnceAndErrorsPropagate) {
  std::vector<std::atomic<int>> hits(1000);
  parallel_for(1000, [&](int64_t t) { hits[size_t(t)]++; });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
  std::vector<int64_t> ends;
  std::vector<int64_t> seen(10, -1);
  parallel_chunks(10, 3, [&](int64_t b, int64_t e) { seen[size_t(b)] = e; });
  EXPECT_EQ(seen[0], 3);
  EXPECT_EQ(seen[9], 10);
  EXPECT_THROW(parallel_for(8, [](int64_t t) { LT_CHECK(t != 5, "task {} failed", t); }), Error);
}

}  // namespace
}  // namespace lt

#include "core/units.h"

namespace lt {
namespace {

TEST(Units, ParseSizes) {
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("512MiB"), size_t(512) << 20);
  EXPECT_EQ(parse_size("1.5 GiB"), size_t(3) << 29);
  EXPECT_EQ(parse_size("80GB"), size_t(80000000000));
  EXPECT_EQ(parse_size("2TiB"), size_t(2) << 40);
  EXPECT_EQ(parse_size(" 10 KB "), 10000u);
  EXPECT_EQ(parse_size("64B"), 64u);
  for (const char* bad : {"", "GiB", "-5MiB", "12 parsecs", "1.5", "1e9", "5 MiBs", "1..2GB"}) {
    try {
      parse_size(bad, "--device-memory");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--device-memory"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(100), "100 B");
}

// The executor pins its host buffers through the workspace's hooks: told of each buffer when it is allocated, of
// the old one before a larger replaces it, and of every buffer when the workspace goes; a reuse tells nothing.
TEST(Workspace, HooksSeeEveryAllocationAndRelease) {
  std::vector<std::string> events;
  std::map<uint8_t*, size_t> live;
  {
    Workspace ws;
    ws.set_hooks({[&](uint8_t* p, size_t n, const std::string& name) {
                    events.push_back("alloc " + name);
                    live[p] = n;
                  },
                  [&](uint8_t* p) {
                    events.push_back("free");
                    EXPECT_EQ(live.erase(p), 1u);
                  }});
    uint8_t* a = ws.get("a", 100);
    EXPECT_EQ(ws.get("a", 50), a);  // reused: no event
    ws.get("b", 10);
    ws.get("a", 10000);  // grows: the old buffer released first
    EXPECT_EQ(live.size(), 2u);
  }
  EXPECT_EQ(events, (std::vector<std::string>{"alloc a", "alloc b", "free", "alloc a", "free", "free"}));
  EXPECT_TRUE(live.empty());
}

// Rng::discard(n) leaves the generator where n next_u64 calls do: the jump's matrix powers against the plain
// sequence, at counts around the powers of two and past 2^21 (the bits an init chunk's offset sets).
TEST(Rng, DiscardIsThatManyDraws) {
  for (const uint64_t n : {0ull, 1ull, 2ull, 3ull, 63ull, 64ull, 65ull, 1000ull, 123457ull, 3000001ull}) {
    Rng walked(42 + n), jumped(42 + n);
    for (uint64_t i = 0; i < n; ++i) walked.next_u64();
    jumped.discard(n);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(jumped.next_u64(), walked.next_u64()) << "after discarding " << n;
  }
  Rng a(7), b(7);  // two jumps add up
  a.discard(5000);
  a.discard(70000);
  b.discard(75000);
  EXPECT_EQ(a.next_u64(), b.next_u64());
}

}  // namespace
}  // namespace lt
