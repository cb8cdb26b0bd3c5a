// Delta decoder: a delta is applied to a base of the size its header names (bounded
// here); a malformed one is a Status, and no byte outside the destination is written
// (ASan watches the buffers). A delta that applies re-encodes and applies to the same bytes.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "weights/delta_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlboost;
  constexpr uint64_t kMaxPayload = 4u << 20;
  DeltaHeader h;
  if (!ReadDeltaHeader(data, size, &h).ok() || h.total_bytes > kMaxPayload) return 0;
  std::vector<uint8_t> base(h.total_bytes), dst(h.total_bytes);
  for (size_t i = 0; i < base.size(); ++i) base[i] = static_cast<uint8_t>(i * 131u + 7u);
  DeltaHeader applied;
  if (!ApplyDelta(data, size, base.data(), dst.data(), h.total_bytes, 1, &applied).ok()) return 0;
  EncodedDelta again;
  if (!EncodeDelta(base.data(), dst.data(), applied, 1, &again).ok()) __builtin_trap();
  std::vector<uint8_t> bytes(again.size()), twice(h.total_bytes);
  again.WriteTo(bytes.data());
  DeltaHeader h2;
  if (!ApplyDelta(bytes.data(), bytes.size(), base.data(), twice.data(), h.total_bytes, 1, &h2).ok()) __builtin_trap();
  if (twice != dst) __builtin_trap();
  return 0;
}
