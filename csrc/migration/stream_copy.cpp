// AVX2 streaming copy with a plain memcpy fallback, chosen at run time.
#include "migration/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define RLB_STREAM_X86 1
#endif

namespace rlboost::migration {

#ifdef RLB_STREAM_X86
namespace {

__attribute__((target("avx2"))) void CopyAvx2(uint8_t* dst, const uint8_t* src, size_t n) {
  // Head bytes up to a 32-byte aligned destination, then 128 bytes per iteration.
  size_t head = (32 - (reinterpret_cast<uintptr_t>(dst) & 31)) & 31;
  if (head > n) head = n;
  std::memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  for (; n >= 128; n -= 128, dst += 128, src += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 64));
    __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 96), d);
  }
  std::memcpy(dst, src, n);
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

}  // namespace

void StreamingCopy(void* dst, const void* src, size_t n) {
  if (HasAvx2() && n >= 4096) {
    CopyAvx2(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
  } else {
    std::memcpy(dst, src, n);
  }
}

void StreamingFence() { _mm_sfence(); }

#else

void StreamingCopy(void* dst, const void* src, size_t n) { std::memcpy(dst, src, n); }
void StreamingFence() {}

#endif

}  // namespace rlboost::migration
