// core/rng.h — a small seeded generator (splitmix64 seeding xoshiro256**) for initialisation and tests.
// Same seed, same sequence, on every platform; normal() uses Box-Muller in double (two draws per value).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/host_device.h"

namespace lt {

// splitmix64: x plus the golden-ratio increment, then its finaliser — a stateless 64-bit mix (keys, seeds, hashes);
// device code too (LoRA's dropout mask, model/lora_mask.h).
LT_HD_INLINE uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) {
      s = splitmix64(seed);
      seed += 0x9e3779b97f4a7c15ull;
    }
  }
  uint64_t next_u64() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    advance(s_);
    return result;
  }
  // Moves the generator `draws` next_u64 calls ahead, in O(log draws): xoshiro256**'s state update is linear
  // over GF(2), so n steps are one 256 x 256 bit matrix, a product of the cached powers T^(2^k) (core/rng.cpp).
  // Lets a long sequence be drawn in parallel chunks with the bits of drawing it in one go.
  void discard(uint64_t draws);
  // The state update of one draw.
  static void advance(uint64_t (&s)[4]) {
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
  }
  // Uniform in [0, 1).
  double uniform() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  float uniform(float lo, float hi) { return lo + float(uniform()) * (hi - lo); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return next_u64() % n; }
  double normal() {
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace lt
