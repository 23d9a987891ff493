// core/rng.cpp — Rng::discard: jumping xoshiro256** ahead by any number of draws.
//
// The state update (Rng::advance) only shifts, rotates and xors, so it is a linear map T on the 256-bit state
// over GF(2): column j of T is the update of the unit state e_j. n draws are T^n = the product of T^(2^k) over
// the set bits k of n. The 64 powers are squared once (64 x 256 matrix-vector products each, a few ms) and
// kept; a jump is then at most 64 matrix-vector products of 256 xors of 4 words.
#include <array>
#include <vector>

#include "core/rng.h"

namespace lt {
namespace {

using State = std::array<uint64_t, 4>;
using Matrix = std::array<State, 256>;  // column j: T applied to e_j

State apply(const Matrix& m, const State& v) {
  State r{};
  for (int j = 0; j < 256; ++j)
    if ((v[size_t(j / 64)] >> (j % 64)) & 1u)
      for (size_t w = 0; w < 4; ++w) r[w] ^= m[size_t(j)][w];
  return r;
}

// powers[k] = T^(2^k), k = 0 .. 63.
const std::vector<Matrix>& powers() {
  static const std::vector<Matrix> p = [] {
    std::vector<Matrix> out(64);
    for (int j = 0; j < 256; ++j) {
      uint64_t s[4] = {0, 0, 0, 0};
      s[j / 64] = uint64_t(1) << (j % 64);
      Rng::advance(s);
      out[0][size_t(j)] = {s[0], s[1], s[2], s[3]};
    }
    for (size_t k = 1; k < out.size(); ++k)
      for (size_t j = 0; j < 256; ++j) out[k][j] = apply(out[k - 1], out[k - 1][j]);  // T^(2^k) = (T^(2^(k-1)))^2
    return out;
  }();
  return p;
}

}  // namespace

void Rng::discard(uint64_t draws) {
  if (draws == 0) return;
  State s{s_[0], s_[1], s_[2], s_[3]};
  const std::vector<Matrix>& p = powers();
  for (size_t k = 0; k < 64; ++k)
    if ((draws >> k) & 1u) s = apply(p[k], s);
  for (size_t w = 0; w < 4; ++w) s_[w] = s[w];
}

}  // namespace lt
