// Request-state and migration-batch decoders: any bytes give a Status without reading
// outside the buffer, and a decoded layout lies inside it.
#include <cstddef>
#include <cstdint>

#include "migration/batch_codec.h"
#include "migration/state_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlboost::migration;
  StateLayout s;
  if (DecodeStates(data, size, &s).ok() && (s.total != size || s.checksum + 4 != size)) __builtin_trap();
  BatchLayout b;
  if (DecodeBatch(data, size, &b).ok()) {
    if (b.total != size || b.states_offset + b.states_len > size) __builtin_trap();
    for (const BatchKV& kv : b.kv) {
      if (kv.offset > size || kv.nbytes > size - kv.offset) __builtin_trap();
    }
  }
  return 0;
}
