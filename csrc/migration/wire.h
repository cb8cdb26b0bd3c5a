// Little-endian field access and overflow-checked size arithmetic for the migration
// wire formats. Every read is at an offset the caller has already bounds-checked.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace rlboost::migration {

template <typename T>
inline T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
  if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
  if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
#endif
  return v;
}

template <typename T>
inline void Store(uint8_t* p, T v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  if constexpr (sizeof(T) == 2) v = __builtin_bswap16(v);
  if constexpr (sizeof(T) == 4) v = __builtin_bswap32(v);
  if constexpr (sizeof(T) == 8) v = __builtin_bswap64(v);
#endif
  std::memcpy(p, &v, sizeof(T));
}

inline double LoadF64(const uint8_t* p) {
  uint64_t bits = Load<uint64_t>(p);
  double v;
  std::memcpy(&v, &bits, 8);
  return v;
}

inline void StoreF64(uint8_t* p, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  Store<uint64_t>(p, bits);
}

// a*b+c without wrapping; false if the result does not fit in 64 bits.
inline bool MulAdd(uint64_t a, uint64_t b, uint64_t c, uint64_t* out) {
  uint64_t prod;
  if (__builtin_mul_overflow(a, b, &prod)) return false;
  return !__builtin_add_overflow(prod, c, out);
}

inline uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

inline bool AllZero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

inline Status ProtocolErr(const std::string& what) { return Status(Code::kProtocol, what); }
inline Status ArgErr(const std::string& what) { return Status(Code::kInvalidArgument, what); }

}  // namespace rlboost::migration
