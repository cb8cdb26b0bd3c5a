// Manifest parser: whatever decodes re-encodes to the same bytes (nothing is accepted that
// the format cannot say), and its layout holds (a tag per chunk, lengths within the payload).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "weights/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlboost;
  Manifest m;
  if (!DecodeManifest(data, size, &m).ok()) return 0;
  uint32_t want = 0;
  if (!ChunkCount(m.total_bytes, m.chunk_bytes, &want).ok() || want != m.num_chunks()) __builtin_trap();
  uint64_t sum = 0;
  for (uint32_t i = 0; i < m.num_chunks(); ++i) sum += m.ChunkLength(i);
  if (sum != m.total_bytes) __builtin_trap();
  std::string again = EncodeManifest(m);
  if (again.size() != size || std::memcmp(again.data(), data, size) != 0) __builtin_trap();
  return 0;
}
