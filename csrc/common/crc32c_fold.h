// CRC-32C by carry-less multiplication (AVX-512 VPCLMULQDQ): sixteen 128-bit lanes fold
// 256 bytes per step, several times the speed of the crc32 instruction. Internal to
// crc32c.cpp, which uses it only after it passed a self-test on this CPU.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rlboost {

// Whether this CPU has what FoldCrc32c needs.
bool FoldCrc32cSupported();
// Advances the raw (uninverted) register over the longest prefix of p that is a multiple
// of 256 bytes (n >= 256 required); returns how many bytes it consumed. The caller
// finishes the rest with the crc32 instruction.
size_t FoldCrc32c(uint32_t* state, const uint8_t* p, size_t n);
// The same, also copying the bytes it consumes from src to dst in the same pass.
// streaming: non-temporal stores, which need dst aligned to 64 bytes.
size_t FoldCopyCrc32c(uint32_t* state, uint8_t* dst, const uint8_t* src, size_t n, bool streaming);

}  // namespace rlboost
