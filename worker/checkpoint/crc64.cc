#include "worker/checkpoint/crc64.h"

#include <array>
#include <cstring>

namespace shardtrain::checkpoint {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the slicing-by-8 loop reads 8 bytes as a little-endian word");

constexpr uint64_t kPoly = 0xC96C5795D7870F42ull;  // ECMA-182, bit-reflected

using Tables = std::array<std::array<uint64_t, 256>, 8>;

// tables[0] is the classic byte-at-a-time table; tables[k][b] is the CRC
// contribution of byte b followed by k zero bytes.
constexpr Tables MakeTables() {
  Tables t{};
  for (uint64_t i = 0; i < 256; ++i) {
    uint64_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[0][i] = c;
  }
  for (int k = 1; k < 8; ++k) {
    for (int i = 0; i < 256; ++i) t[k][i] = (t[k - 1][i] >> 8) ^ t[0][t[k - 1][i] & 0xff];
  }
  return t;
}

constexpr Tables kTables = MakeTables();

}  // namespace

uint64_t Crc64Extend(uint64_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t c = ~crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    const uint64_t x = c ^ word;
    c = kTables[7][x & 0xff] ^ kTables[6][(x >> 8) & 0xff] ^ kTables[5][(x >> 16) & 0xff] ^
        kTables[4][(x >> 24) & 0xff] ^ kTables[3][(x >> 32) & 0xff] ^ kTables[2][(x >> 40) & 0xff] ^
        kTables[1][(x >> 48) & 0xff] ^ kTables[0][x >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = kTables[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

}  // namespace shardtrain::checkpoint
