// Counter-based randomness shared by the engine and the data sampler: SplitMix64 (Steele et al.),
// the finaliser used wherever a value must be a pure function of a key (the
// initial weights of any element, the data windows of any step), so that
// every rank and every shard computes the same numbers without a stream.
#ifndef SHARDTRAIN_COMMON_RNG_H_
#define SHARDTRAIN_COMMON_RNG_H_

#include <cstdint>

namespace shardtrain {

inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace shardtrain

#endif  // SHARDTRAIN_COMMON_RNG_H_
