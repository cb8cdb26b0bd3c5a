// memcpy with non-temporal stores, for copies much larger than the last-level cache: the
// destination is written without first being read into the cache.
#pragma once

#include <cstddef>

namespace rlboost::migration {

// Copies n bytes; falls back to memcpy where the CPU lacks the instructions.
void StreamingCopy(void* dst, const void* src, size_t n);

// Orders this thread's streaming stores before later stores (call once per task).
void StreamingFence();

}  // namespace rlboost::migration
