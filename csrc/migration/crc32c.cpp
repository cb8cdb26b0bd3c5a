// CRC-32C with the reflected polynomial 0x82F63B78, initial value and final xor ~0.
#include "migration/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <nmmintrin.h>
#define RLB_CRC_X86 1
#endif

namespace rlboost::migration {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables MakeTables() {
  Tables t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; ++i) {
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
  return t;
}

const Tables& GetTables() {
  static const Tables tables = MakeTables();
  return tables;
}

// Raw (no pre/post inversion) update, slicing by 8 bytes.
uint32_t UpdatePortable(uint32_t c, const uint8_t* p, size_t n) {
  const Tables& t = GetTables();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^
        t[4][(w >> 24) & 0xFF] ^ t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^
        t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

#ifdef RLB_CRC_X86
__attribute__((target("sse4.2"))) uint32_t UpdateHardware(uint32_t c, const uint8_t* p,
                                                          size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = _mm_crc32_u64(c64, w);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool HasHardware() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

// Polynomial product a*b modulo the CRC polynomial, in the reflected bit order.
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(2^k) mod P for k = 0..63, so x^(8n) is a product of at most 64 table entries.
std::array<uint32_t, 64> MakePowers() {
  std::array<uint32_t, 64> p{};
  p[0] = 1u << 30;  // x^1
  for (size_t k = 1; k < p.size(); ++k) p[k] = MulModP(p[k - 1], p[k - 1]);
  return p;
}

}  // namespace

uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc) {
  return ~UpdatePortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
#ifdef RLB_CRC_X86
  if (HasHardware()) return ~UpdateHardware(~crc, static_cast<const uint8_t*>(data), n);
#endif
  return Crc32cPortable(data, n, crc);
}

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  static const std::array<uint32_t, 64> powers = MakePowers();
  uint32_t shift = 1u << 31;  // x^0
  uint64_t bits = len_b;
  for (size_t k = 3; bits != 0 && k < powers.size(); ++k, bits >>= 1) {
    if (bits & 1) shift = MulModP(powers[k], shift);
  }
  return MulModP(shift, crc_a) ^ crc_b;
}

}  // namespace rlboost::migration
