// CRC-64/XZ (a.k.a. CRC-64/GO-ECMA): the 64-bit CRC that xz and Go's
// hash/crc64 (ECMA table) compute. Reflected ECMA-182 polynomial
// 0xC96C5795D7870F42, init and final xor all ones; check value
// Crc64("123456789") == 0x995DC9BBDF1939FA. Slicing-by-8, a few GB/s.
//
// Thread-safe (pure functions over constant tables).
#ifndef SHARDTRAIN_WORKER_CHECKPOINT_CRC64_H_
#define SHARDTRAIN_WORKER_CHECKPOINT_CRC64_H_

#include <cstddef>
#include <cstdint>

namespace shardtrain::checkpoint {

// Returns the CRC of (A ++ data[0, n)) where `crc` is the CRC of some
// string A. Crc64Extend(0, ...) starts a new CRC, so
// Crc64Extend(Crc64Extend(0, a, na), b, nb) == CRC of a ++ b.
uint64_t Crc64Extend(uint64_t crc, const void* data, size_t n);

inline uint64_t Crc64(const void* data, size_t n) { return Crc64Extend(0, data, n); }

}  // namespace shardtrain::checkpoint

#endif  // SHARDTRAIN_WORKER_CHECKPOINT_CRC64_H_
