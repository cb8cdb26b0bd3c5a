// Folding CRC-32C. The register is a polynomial over GF(2) held bit-reflected in 128-bit
// lanes (lane bit m is the coefficient of x^(127-m)). Moving a lane F bits forward
// multiplies its two 64-bit halves by x^(F+63) and x^(F-1) mod P (the -1 absorbs the
// one-bit offset of a reflected carry-less product); everything stays congruent mod P,
// so the crc32 instruction over the final 16 bytes gives the checksum of the whole.
#include "common/crc32c_fold.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rlboost {
namespace {

constexpr uint64_t kPolyNormal = 0x1EDC6F41u;  // Castagnoli, x^32 implied

uint32_t XPowModP(unsigned n) {
  uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if (r & (uint64_t{1} << 32)) r ^= (uint64_t{1} << 32) | kPolyNormal;
  }
  return static_cast<uint32_t>(r);
}

uint32_t Reflect32(uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; i < 32; ++i) r |= ((v >> i) & 1u) << (31 - i);
  return r;
}

struct FoldKey {
  uint64_t hi_half;  // multiplies the lane's low qword (its higher-degree half)
  uint64_t lo_half;  // multiplies the lane's high qword
};

FoldKey KeyFor(unsigned bits) {
  return FoldKey{uint64_t{Reflect32(XPowModP(bits + 63))} << 32,
                 uint64_t{Reflect32(XPowModP(bits - 1))} << 32};
}

}  // namespace

#if defined(__x86_64__)
namespace {

struct Keys {
  FoldKey k2048 = KeyFor(2048), k512 = KeyFor(512), k384 = KeyFor(384), k256 = KeyFor(256),
          k128 = KeyFor(128);
};

const Keys& FoldKeys() {
  static const Keys keys;
  return keys;
}

#define RLB_FOLD_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,vpclmulqdq,pclmul,sse4.2")))

RLB_FOLD_TARGET inline __m512i Broadcast(const FoldKey& k) {
  return _mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<long long>(k.lo_half),
                                               static_cast<long long>(k.hi_half)));
}

RLB_FOLD_TARGET inline __m512i Fold512(__m512i x, __m512i k, __m512i next) {
  __m512i a = _mm512_clmulepi64_epi128(x, k, 0x00);
  __m512i b = _mm512_clmulepi64_epi128(x, k, 0x11);
  return _mm512_ternarylogic_epi64(a, b, next, 0x96);  // a ^ b ^ next
}

RLB_FOLD_TARGET inline __m128i Fold128(__m128i x, const FoldKey& key) {
  __m128i k = _mm_set_epi64x(static_cast<long long>(key.lo_half), static_cast<long long>(key.hi_half));
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

// Where FoldImpl puts the bytes it reads, besides into the checksum.
enum class Sink { kNone, kCached, kStreaming };

template <Sink S>
RLB_FOLD_TARGET inline __m512i LoadAndCopy(const uint8_t* p, uint8_t* dst) {
  __m512i v = _mm512_loadu_si512(p);
  if constexpr (S == Sink::kCached) _mm512_storeu_si512(dst, v);
  if constexpr (S == Sink::kStreaming) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), v);
  return v;
}

// Checksums (and, unless S is kNone, copies to dst) the first n / 256 * 256 bytes of p.
template <Sink S>
RLB_FOLD_TARGET size_t FoldImpl(uint32_t* state, const uint8_t* p, uint8_t* dst, size_t n) {
  const Keys& keys = FoldKeys();
  size_t groups = n / 256;
  __m512i z0 = LoadAndCopy<S>(p, dst);
  __m512i z1 = LoadAndCopy<S>(p + 64, dst + 64);
  __m512i z2 = LoadAndCopy<S>(p + 128, dst + 128);
  __m512i z3 = LoadAndCopy<S>(p + 192, dst + 192);
  // The running register enters as the first 32 bits of the message (CRC linearity).
  z0 = _mm512_xor_si512(z0, _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(*state))));
  __m512i k = Broadcast(keys.k2048);
  for (size_t g = 1; g < groups; ++g) {
    const uint8_t* q = p + 256 * g;
    uint8_t* o = dst + 256 * g;
    z0 = Fold512(z0, k, LoadAndCopy<S>(q, o));
    z1 = Fold512(z1, k, LoadAndCopy<S>(q + 64, o + 64));
    z2 = Fold512(z2, k, LoadAndCopy<S>(q + 128, o + 128));
    z3 = Fold512(z3, k, LoadAndCopy<S>(q + 192, o + 192));
  }
  // Streaming stores are weakly ordered: make them visible before the caller says done.
  if constexpr (S == Sink::kStreaming) _mm_sfence();
  __m512i k512 = Broadcast(keys.k512);
  z1 = Fold512(z0, k512, z1);
  z2 = Fold512(z1, k512, z2);
  z3 = Fold512(z2, k512, z3);
  __m128i x = _mm512_extracti32x4_epi32(z3, 3);
  x = _mm_xor_si128(x, Fold128(_mm512_extracti32x4_epi32(z3, 0), keys.k384));
  x = _mm_xor_si128(x, Fold128(_mm512_extracti32x4_epi32(z3, 1), keys.k256));
  x = _mm_xor_si128(x, Fold128(_mm512_extracti32x4_epi32(z3, 2), keys.k128));
  uint64_t lo = static_cast<uint64_t>(_mm_cvtsi128_si64(x));
  uint64_t hi = static_cast<uint64_t>(_mm_extract_epi64(x, 1));
  *state = static_cast<uint32_t>(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi));
  return groups * 256;
}

}  // namespace

bool FoldCrc32cSupported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("vpclmulqdq") &&
         __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.2");
}

size_t FoldCrc32c(uint32_t* state, const uint8_t* p, size_t n) {
  // Nothing is stored with kNone; p only gives the unused destination a valid address.
  return FoldImpl<Sink::kNone>(state, p, const_cast<uint8_t*>(p), n);
}

size_t FoldCopyCrc32c(uint32_t* state, uint8_t* dst, const uint8_t* src, size_t n, bool streaming) {
  return streaming ? FoldImpl<Sink::kStreaming>(state, src, dst, n)
                   : FoldImpl<Sink::kCached>(state, src, dst, n);
}

#else
bool FoldCrc32cSupported() { return false; }
size_t FoldCrc32c(uint32_t*, const uint8_t*, size_t) { return 0; }
size_t FoldCopyCrc32c(uint32_t*, uint8_t*, const uint8_t*, size_t, bool) { return 0; }
#endif

}  // namespace rlboost
