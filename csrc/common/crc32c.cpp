// CRC-32C: a hardware path (three lanes of the SSE4.2 crc32 instruction, recombined with
// a precomputed "advance by one lane" table) and a portable slicing-by-8 path.
#include "common/crc32c.h"

#include "common/crc32c_fold.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rlboost {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

struct SliceTables {
  uint32_t t[8][256];
  SliceTables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
    }
  }
};

const SliceTables& Slices() {
  static const SliceTables tables;
  return tables;
}

// Raw register update (no pre/post inversion) over n bytes.
uint32_t RawPortable(uint32_t c, const uint8_t* p, size_t n) {
  const auto& t = Slices().t;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= c;
    c = t[7][w & 0xFF] ^ t[6][(w >> 8) & 0xFF] ^ t[5][(w >> 16) & 0xFF] ^ t[4][(w >> 24) & 0xFF] ^
        t[3][(w >> 32) & 0xFF] ^ t[2][(w >> 40) & 0xFF] ^ t[1][(w >> 48) & 0xFF] ^ t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
// Each lane covers kLane bytes; three lanes run at once, then the first two are advanced
// past the bytes of the lanes after them and folded together (CRC is linear over GF(2)).
constexpr size_t kLane = 4096;

__attribute__((target("sse4.2"))) uint32_t RawHwSerial(uint32_t c, const uint8_t* p, size_t n) {
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

// Linear map "advance the register over kLane zero bytes", as four byte-indexed tables.
struct AdvanceTable {
  uint32_t t[4][256];
  AdvanceTable() {
    static const uint8_t zeros[kLane] = {};
    uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) basis[bit] = RawHwSerial(1u << bit, zeros, kLane);
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t v = 0;
        for (int j = 0; j < 8; ++j) {
          if (b & (1u << j)) v ^= basis[8 * k + j];
        }
        t[k][b] = v;
      }
    }
  }
  uint32_t Advance(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t RawHw(uint32_t c, const uint8_t* p, size_t n) {
  static const AdvanceTable advance;
  while (n >= 3 * kLane) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    const uint8_t* p1 = p + kLane;
    const uint8_t* p2 = p + 2 * kLane;
    for (size_t i = 0; i < kLane; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p1 + i, 8);
      std::memcpy(&w2, p2 + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    uint32_t a = advance.Advance(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
    c = advance.Advance(a) ^ static_cast<uint32_t>(c2);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  return RawHwSerial(c, p, n);
}

bool DetectHardware() { return __builtin_cpu_supports("sse4.2"); }
#else
uint32_t RawHw(uint32_t c, const uint8_t* p, size_t n) { return RawPortable(c, p, n); }
bool DetectHardware() { return false; }
#endif

const bool kUseHardware = DetectHardware();

// Below this size the folding setup costs more than it saves.
constexpr size_t kFoldMin = 1024;
// Without folding, Crc32cCopy copies this much, then checksums it while it is in L2.
constexpr size_t kCopyBlock = 256u << 10;

// The folding paths are used only if they agree with the table path on this CPU.
bool FoldPassesSelfTest() {
  if (!kUseHardware || !FoldCrc32cSupported()) return false;
  alignas(64) uint8_t buf[4096 + 77];
  alignas(64) uint8_t copy[sizeof(buf)];
  uint32_t x = 0x12345678u;
  for (auto& b : buf) {
    x = x * 1103515245u + 12345u;
    b = static_cast<uint8_t>(x >> 24);
  }
  for (size_t n : {size_t{1024}, size_t{1536}, size_t{4096 + 77}}) {
    for (uint32_t seed : {0u, 0xFFFFFFFFu, 0xDEADBEEFu}) {
      const uint32_t want = RawPortable(seed, buf, n);
      uint32_t state = seed;
      size_t used = FoldCrc32c(&state, buf, n);
      if (RawPortable(state, buf + used, n - used) != want) return false;
      for (bool streaming : {false, true}) {
        std::memset(copy, 0, sizeof(copy));
        state = seed;
        used = FoldCopyCrc32c(&state, copy, buf, n, streaming);
        if (RawPortable(state, buf + used, n - used) != want) return false;
        if (std::memcmp(copy, buf, used) != 0) return false;
      }
    }
  }
  return true;
}

const bool kUseFold = FoldPassesSelfTest();

uint32_t RawBest(uint32_t c, const uint8_t* p, size_t n) {
  if (kUseFold && n >= kFoldMin) {
    size_t used = FoldCrc32c(&c, p, n);
    p += used;
    n -= used;
  }
  return RawHw(c, p, n);
}

// Polynomial product a*b modulo P, in the reflected bit order (bit 31 is x^0).
uint32_t MulModP(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t m = 1u << 31; m != 0; m >>= 1) {
    if (a & m) product ^= b;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return product;
}

// x^(2^k) mod P for k = 0..63, so x^(8n) is a product of at most 64 of them.
struct PowerTable {
  uint32_t p[64];
  PowerTable() {
    p[0] = 1u << 30;  // x^1
    for (int k = 1; k < 64; ++k) p[k] = MulModP(p[k - 1], p[k - 1]);
  }
};

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  static const PowerTable powers;
  uint32_t shift = 1u << 31;  // x^0
  // Appending len_b bytes multiplies crc(A) by x^(8 len_b): bits of len_b pick x^(2^(k+3)).
  for (int k = 3; len_b != 0 && k < 64; ++k, len_b >>= 1) {
    if (len_b & 1) shift = MulModP(powers.p[k], shift);
  }
  return MulModP(shift, crc_a) ^ crc_b;
}

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  return ~RawPortable(~crc, static_cast<const uint8_t*>(data), n);
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  return kUseHardware ? ~RawBest(~crc, p, n) : ~RawPortable(~crc, p, n);
}

uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t n, bool streaming) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (!kUseFold) {
    // Copy a block, then checksum it while it is still in cache.
    for (size_t done = 0; done < n;) {
      size_t k = std::min(kCopyBlock, n - done);
      std::memcpy(d + done, s + done, k);
      crc = Crc32cExtend(crc, d + done, k);
      done += k;
    }
    return crc;
  }
  uint32_t c = ~crc;
  if (streaming) {  // non-temporal stores need a 64-byte aligned destination
    size_t head = std::min(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
    std::memcpy(d, s, head);
    c = RawHw(c, s, head);
    d += head;
    s += head;
    n -= head;
  }
  if (n >= kFoldMin) {
    size_t used = FoldCopyCrc32c(&c, d, s, n, streaming);
    d += used;
    s += used;
    n -= used;
  }
  std::memcpy(d, s, n);
  return ~RawHw(c, s, n);
}

bool Crc32cUsesHardware() { return kUseHardware; }

bool Crc32cUsesFolding() { return kUseFold; }

}  // namespace rlboost
