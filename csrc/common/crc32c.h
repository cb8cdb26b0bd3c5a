// CRC-32C (Castagnoli), the per-chunk checksum of weight transfers. Large buffers fold
// with AVX-512 carry-less multiplies when the CPU has them (crc32c_fold.h); otherwise,
// and for the tails, the SSE4.2 crc32 instruction runs three interleaved lanes (hiding
// its latency); a slicing-by-8 table covers CPUs with neither.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rlboost {

// Continues a running checksum: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// Copies n bytes from src to dst and returns Crc32cExtend(crc, src, n), reading src once
// (the checksum is taken from the loaded registers, not from a second pass over dst).
// streaming: dst is written with non-temporal stores, for large copies whose destination
// is not read again soon; they neither fill nor evict the cache.
uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t n, bool streaming);

// Checksum of A||B from Crc32c(A), Crc32c(B) and B's length, so large buffers can be
// checksummed in pieces by several threads.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// The table-driven path, always available; exposed so tests can compare both paths.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

// True when Crc32cExtend uses the hardware instruction on this CPU.
bool Crc32cUsesHardware();
// True when it also folds large buffers with carry-less multiplication.
bool Crc32cUsesFolding();

}  // namespace rlboost
