// CRC-32C (Castagnoli) for migration buffers: hardware (SSE4.2) when the CPU has it, a
// portable slicing-by-8 table otherwise, and combination of chunk checksums so large
// buffers can be checksummed by several threads.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rlboost::migration {

// Checksum of data[0, n) continuing from `crc` (pass 0 to start a new checksum).
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);

// The portable path only; exposed so tests can check both paths agree.
uint32_t Crc32cPortable(const void* data, size_t n, uint32_t crc = 0);

// Checksum of A||B from crc(A), crc(B) and len(B).
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace rlboost::migration
