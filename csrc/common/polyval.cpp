// POLYVAL. Field elements are 128-bit little-endian polynomials (bit i: coefficient of
// x^i) modulo P = x^128 + x^127 + x^126 + x^121 + 1, and dot(a, b) = a*b*x^-128 mod P.
// The product of two elements is 256 bits (c3:c2:c1:c0, 64 bits each); x^-128 is a
// Montgomery reduction in two 64-bit steps: adding c0*P clears c0, and since P = 1 +
// x^64*K(x) + x^128 with K = x^57 + x^62 + x^63 (0xC2 << 56), that adds clmul(c0, K) to
// (c2:c1) and c0 to c2; then the same for c1. What is left in (c3:c2) is the result.
// dot is bilinear, so eight blocks times eight key powers are summed unreduced and
// reduced once.
#include "common/polyval.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace rlboost {
namespace {

constexpr uint64_t kK = 0xC200000000000000ull;

struct U128 {
  uint64_t lo, hi;
};

U128 ClmulSoft(uint64_t a, uint64_t b) {
  U128 r{0, 0};
  for (int i = 0; i < 64; ++i) {
    if ((b >> i) & 1) {
      r.lo ^= a << i;
      r.hi ^= i ? a >> (64 - i) : 0;
    }
  }
  return r;
}

void DotSoft(const uint64_t a[2], const uint64_t b[2], uint64_t out[2]) {
  U128 lo = ClmulSoft(a[0], b[0]), hi = ClmulSoft(a[1], b[1]);
  U128 m1 = ClmulSoft(a[0], b[1]), m2 = ClmulSoft(a[1], b[0]);
  uint64_t c0 = lo.lo, c1 = lo.hi ^ m1.lo ^ m2.lo, c2 = hi.lo ^ m1.hi ^ m2.hi, c3 = hi.hi;
  U128 t = ClmulSoft(c0, kK);
  c1 ^= t.lo;
  c2 ^= t.hi ^ c0;
  t = ClmulSoft(c1, kK);
  c2 ^= t.lo;
  c3 ^= t.hi ^ c1;
  out[0] = c2;
  out[1] = c3;
}

void Load(const uint8_t* p, uint64_t out[2]) { std::memcpy(out, p, 16); }

void BlocksSoft(const PolyvalKey& key, uint64_t acc[2], const uint8_t* p, size_t nblocks) {
  for (size_t i = 0; i < nblocks; ++i) {
    uint64_t x[2];
    Load(p + 16 * i, x);
    x[0] ^= acc[0];
    x[1] ^= acc[1];
    DotSoft(x, key.powers[0], acc);
  }
}

#if defined(__x86_64__)
#define RLB_CLMUL __attribute__((target("pclmul,sse4.1")))
#define RLB_WIDE __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.1")))

RLB_CLMUL inline __m128i KeyAt(const PolyvalKey& key, int i) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(key.powers[i]));
}

// (hi:lo) -> dot reduction, see the file comment.
RLB_CLMUL inline __m128i Reduce(__m128i lo, __m128i hi) {
  const __m128i k = _mm_set_epi64x(static_cast<long long>(kK), 0);
  __m128i t = _mm_clmulepi64_si128(lo, k, 0x10);  // c0 * K
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4E), t);  // low: c1 ^ t.lo, high: c0 ^ t.hi
  t = _mm_clmulepi64_si128(lo, k, 0x10);
  lo = _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4E), t);
  return _mm_xor_si128(hi, lo);
}

RLB_CLMUL inline void MulAcc(__m128i x, __m128i h, __m128i* lo, __m128i* mid, __m128i* hi) {
  *lo = _mm_xor_si128(*lo, _mm_clmulepi64_si128(x, h, 0x00));
  *hi = _mm_xor_si128(*hi, _mm_clmulepi64_si128(x, h, 0x11));
  *mid = _mm_xor_si128(*mid, _mm_xor_si128(_mm_clmulepi64_si128(x, h, 0x01), _mm_clmulepi64_si128(x, h, 0x10)));
}

RLB_CLMUL inline __m128i Assemble(__m128i lo, __m128i mid, __m128i hi) {
  return Reduce(_mm_xor_si128(lo, _mm_slli_si128(mid, 8)), _mm_xor_si128(hi, _mm_srli_si128(mid, 8)));
}

RLB_CLMUL void BlocksClmul(const PolyvalKey& key, uint64_t acc_out[2], const uint8_t* p, size_t nblocks) {
  __m128i acc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc_out));
  for (; nblocks >= 8; nblocks -= 8, p += 128) {
    __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
    for (int j = 0; j < 8; ++j) {
      __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * j));
      if (j == 0) x = _mm_xor_si128(x, acc);
      MulAcc(x, KeyAt(key, 7 - j), &lo, &mid, &hi);
    }
    acc = Assemble(lo, mid, hi);
  }
  for (; nblocks > 0; --nblocks, p += 16) {
    __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
    MulAcc(_mm_xor_si128(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), KeyAt(key, 0), &lo, &mid, &hi);
    acc = Assemble(lo, mid, hi);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(acc_out), acc);
}

// Two blocks per 256-bit register: lanes (X_j, X_j+1) times (H^(9-j), H^(8-j)). The middle
// product is Karatsuba's (x0^x1)(h0^h1), corrected by lo and hi once per group.
RLB_WIDE inline void MulAcc2(__m256i x, __m256i h, __m256i hmid, __m256i* lo, __m256i* mid, __m256i* hi) {
  *lo = _mm256_xor_si256(*lo, _mm256_clmulepi64_epi128(x, h, 0x00));
  *hi = _mm256_xor_si256(*hi, _mm256_clmulepi64_epi128(x, h, 0x11));
  __m256i xs = _mm256_xor_si256(x, _mm256_shuffle_epi32(x, 0x4E));
  *mid = _mm256_xor_si256(*mid, _mm256_clmulepi64_epi128(xs, hmid, 0x00));
}

RLB_WIDE inline __m128i Fold(__m256i v) {
  return _mm_xor_si128(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
}

constexpr int kWidePairs = PolyvalKey::kPowers / 2;

struct WideKeys {
  __m256i k[kWidePairs];
  __m256i mid[kWidePairs];  // h0 ^ h1 of each power, in the low half of its lane
};

RLB_WIDE inline WideKeys LoadWide(const PolyvalKey& key) {
  WideKeys w;
  constexpr int top = PolyvalKey::kPowers - 1;
  for (int i = 0; i < kWidePairs; ++i) {
    w.k[i] = _mm256_set_m128i(KeyAt(key, top - 1 - 2 * i), KeyAt(key, top - 2 * i));
    w.mid[i] = _mm256_xor_si256(w.k[i], _mm256_shuffle_epi32(w.k[i], 0x4E));
  }
  return w;
}

// One group of kPowers blocks (x: kWidePairs registers); returns the new accumulator.
// The previous accumulator enters last: everything before it can run ahead of the
// previous group's reduction, so the chain from group to group is one multiply, a few
// XORs and the reduction.
RLB_WIDE inline __m128i Group(const WideKeys& w, __m128i acc, const __m256i* x) {
  __m256i lo = _mm256_setzero_si256(), mid = lo, hi = lo;
  for (int i = 1; i < kWidePairs; ++i) MulAcc2(x[i], w.k[i], w.mid[i], &lo, &mid, &hi);
  MulAcc2(_mm256_xor_si256(x[0], _mm256_set_m128i(_mm_setzero_si128(), acc)), w.k[0], w.mid[0], &lo, &mid, &hi);
  __m128i l = Fold(lo), h = Fold(hi);
  return Assemble(l, _mm_xor_si128(Fold(mid), _mm_xor_si128(l, h)), h);
}

RLB_WIDE void BlocksWide(const PolyvalKey& key, uint64_t acc_out[2], const uint8_t* p, size_t nblocks) {
  __m128i acc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc_out));
  const WideKeys w = LoadWide(key);
  for (; nblocks >= PolyvalKey::kPowers; nblocks -= PolyvalKey::kPowers, p += 16 * PolyvalKey::kPowers) {
    __m256i x[kWidePairs];
    for (int i = 0; i < kWidePairs; ++i) x[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + i);
    acc = Group(w, acc, x);
  }
  _mm_storeu_si128(reinterpret_cast<__m128i*>(acc_out), acc);
  if (nblocks > 0) BlocksClmul(key, acc_out, p, nblocks);
}

// Copies whole groups and hashes them from the loaded registers; returns the bytes done.
RLB_WIDE size_t CopyWide(const PolyvalKey& key, uint64_t acc_out[2], uint8_t* dst, const uint8_t* src,
                         size_t n, bool streaming) {
  constexpr size_t kGroupBytes = 16 * PolyvalKey::kPowers;
  __m128i acc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(acc_out));
  const WideKeys w = LoadWide(key);
  const bool stream = streaming && (reinterpret_cast<uintptr_t>(dst) & 31) == 0;
  size_t done = 0;
  for (; n - done >= kGroupBytes; done += kGroupBytes) {
    const auto* s = reinterpret_cast<const __m256i*>(src + done);
    auto* d = reinterpret_cast<__m256i*>(dst + done);
    __m256i x[kWidePairs];
    for (int i = 0; i < kWidePairs; ++i) x[i] = _mm256_loadu_si256(s + i);
    for (int i = 0; i < kWidePairs; ++i) {
      if (stream) {
        _mm256_stream_si256(d + i, x[i]);
      } else {
        _mm256_storeu_si256(d + i, x[i]);
      }
    }
    acc = Group(w, acc, x);
  }
  if (stream) _mm_sfence();
  _mm_storeu_si128(reinterpret_cast<__m128i*>(acc_out), acc);
  return done;
}

RLB_CLMUL void DotClmul(const uint64_t a[2], const uint64_t b[2], uint64_t out[2]) {
  __m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;
  MulAcc(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)),
         _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), &lo, &mid, &hi);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), Assemble(lo, mid, hi));
}
#endif

enum class Path { kSoft, kClmul, kWide };

Path DetectPath() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("pclmul") || !__builtin_cpu_supports("sse4.1")) return Path::kSoft;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("vpclmulqdq")) return Path::kWide;
  return Path::kClmul;
#else
  return Path::kSoft;
#endif
}

Path CurrentPath() {
  static const Path path = DetectPath();
  return path;
}

void RunBlocks(const PolyvalKey& key, uint64_t acc[2], const uint8_t* p, size_t nblocks) {
  switch (CurrentPath()) {
#if defined(__x86_64__)
    case Path::kWide: return BlocksWide(key, acc, p, nblocks);
    case Path::kClmul: return BlocksClmul(key, acc, p, nblocks);
#endif
    default: return BlocksSoft(key, acc, p, nblocks);
  }
}

void Dot(const uint64_t a[2], const uint64_t b[2], uint64_t out[2]) {
#if defined(__x86_64__)
  if (CurrentPath() != Path::kSoft) return DotClmul(a, b, out);
#endif
  DotSoft(a, b, out);
}

}  // namespace

PolyvalKey::PolyvalKey(const Block128& h) {
  Load(h.data(), powers[0]);
  for (int i = 1; i < kPowers; ++i) Dot(powers[i - 1], powers[0], powers[i]);
}

void Polyval::Blocks(const uint8_t* p, size_t nblocks) { RunBlocks(*key_, acc_, p, nblocks); }

void Polyval::Update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (partial_len_ > 0) {
    size_t take = std::min(n, 16 - partial_len_);
    std::memcpy(partial_ + partial_len_, p, take);
    partial_len_ += take;
    p += take;
    n -= take;
    if (partial_len_ < 16) return;
    Blocks(partial_, 1);
    partial_len_ = 0;
  }
  Blocks(p, n / 16);
  partial_len_ = n % 16;
  std::memcpy(partial_, p + n - partial_len_, partial_len_);
}

void Polyval::UpdateCopy(void* dst, const void* src, size_t n, bool streaming) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t done = 0;
#if defined(__x86_64__)
  if (partial_len_ == 0 && CurrentPath() == Path::kWide) done = CopyWide(*key_, acc_, d, s, n, streaming);
#endif
  // The rest is copied first and hashed from the destination, so what is hashed is what
  // was written even if the source changes meanwhile.
  std::memcpy(d + done, s + done, n - done);
  Update(d + done, n - done);
}

Block128 Polyval::Finish() {
  if (partial_len_ > 0) {
    std::memset(partial_ + partial_len_, 0, 16 - partial_len_);
    Blocks(partial_, 1);
    partial_len_ = 0;
  }
  Block128 out;
  std::memcpy(out.data(), acc_, 16);
  return out;
}

Block128 PolyvalOf(const PolyvalKey& key, const void* data, size_t n) {
  Polyval p(key);
  p.Update(data, n);
  return p.Finish();
}

Block128 PolyvalPortable(const Block128& h, const void* data, size_t n) {
  // Straight from the definition: S = (S + X) * H * x^-128 mod P, one bit at a time.
  auto bit = [](const uint8_t* v, int i) { return (v[i / 8] >> (i % 8)) & 1; };
  uint8_t s[16] = {};
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t off = 0; off < n; off += 16) {
    uint8_t x[16] = {};
    std::memcpy(x, p + off, std::min<size_t>(16, n - off));
    for (int i = 0; i < 16; ++i) x[i] ^= s[i];
    uint8_t prod[32] = {};  // x * h, 255 bits
    for (int i = 0; i < 128; ++i) {
      if (!bit(x, i)) continue;
      for (int j = 0; j < 128; ++j) {
        if (bit(h.data(), j)) prod[(i + j) / 8] ^= static_cast<uint8_t>(1u << ((i + j) % 8));
      }
    }
    // Montgomery: add P * x^i for every set low bit i, then divide by x^128.
    for (int i = 0; i < 128; ++i) {
      if (!bit(prod, i)) continue;
      for (int t : {0, 121, 126, 127, 128}) prod[(i + t) / 8] ^= static_cast<uint8_t>(1u << ((i + t) % 8));
    }
    std::memcpy(s, prod + 16, 16);
  }
  Block128 out;
  std::memcpy(out.data(), s, 16);
  return out;
}

bool PolyvalUsesHardware() { return CurrentPath() != Path::kSoft; }

}  // namespace rlboost
