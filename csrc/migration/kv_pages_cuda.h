// CUDA side of KV page copies; compiled only when nvcc is found (RLBOOST_HAS_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "migration/kv_pages.h"

namespace rlboost::migration {

// The address a kernel on `device` uses for host memory at `addr` (pinned memory only).
Status DevicePointerForHost(int device, uint64_t addr, uint64_t* device_addr);

// Enqueues one kernel that performs every segment, on `stream` of `device`.
Status CopySegmentsCuda(int device, const Segment* segs, size_t n, uint64_t stream);

}  // namespace rlboost::migration
