// Counter-based randomness: every random number in the engine is a pure function of (seed, stream, index), so
// runs are reproducible, resumable at any step, and independent of how work is split over ranks.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace ms {

// splitmix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014; constants
// from https://prng.di.unimi.it/splitmix64.c). A bijective 64-bit mixer: equal inputs give equal outputs,
// nearby inputs give unrelated ones. Used as a stateless hash and as the step of SplitMix64 below.
constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Hash of a (seed, a, b) triple, e.g. (seed, step, sample). Each component goes through a full splitmix64
// round before the next is mixed in, so (s, a, b) and (s, b, a) differ.
constexpr uint64_t hashCombine(uint64_t seed, uint64_t a, uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

// A tiny sequential generator: the SplitMix64 stream starting at `state`. Deterministic across platforms.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : m_state(state) {}
  uint64_t next() {
    m_state += 0x9e3779b97f4a7c15ull;
    uint64_t z = m_state;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) for n >= 1 by Lemire's multiply-shift (bias < n / 2^64, negligible here).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  uint64_t m_state;
};

// FNV-1a of a string (per-parameter streams are keyed by the parameter's name).
constexpr uint64_t hashString(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Uniform in [0, 1) from the top 53 bits.
inline double uniform01(uint64_t bits) {
  return double(bits >> 11) * (1.0 / 9007199254740992.0);
}

// Standard normal number `index` of stream `key` (Box-Muller on two counter-derived uniforms).
inline double normalAt(uint64_t key, uint64_t index) {
  const double u1 = uniform01(hashCombine(key, 2 * index, 0)) + 1e-300;
  const double u2 = uniform01(hashCombine(key, 2 * index + 1, 0));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace ms
