// Gather a sample's KV pages out of a paged cache into one contiguous buffer, and scatter
// such a buffer back into (possibly another engine's) cache.
//
// The cache is one contiguous array [num_layers, 2, num_blocks, block_size, row] where a
// row is one token's K (or V) for all kv heads (num_kv_heads * head_dim * itemsize bytes).
// The packed buffer of a sample with kv_tokens tokens is ordered [layer][k/v][token][row]:
// exactly kv_tokens * 2 * num_layers * row bytes, independent of the block size, so
// engines with different block sizes and block tables can exchange it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace rlboost::migration {

constexpr int kHostDevice = -1;

struct KVGeometry {
  uint64_t num_layers = 0, num_blocks = 0, block_size = 0, row_bytes = 0;
};

struct MemRef {
  uint64_t addr = 0, nbytes = 0;
  int device = kHostDevice;  // CUDA device index, or kHostDevice
};

// One sample: its block table is block_ids[table_offset, table_offset + table_len).
struct SampleRef {
  uint64_t table_offset = 0, table_len = 0, kv_tokens = 0, data_addr = 0, data_nbytes = 0;
};

// One contiguous copy, by absolute address (device addresses for CUDA copies).
struct Segment {
  uint64_t src = 0, dst = 0, len = 0;
};

enum class Direction { kGather, kScatter };

// Copies every sample's pages (gather: cache -> data; scatter: data -> cache). Checks
// every input first (kInvalidArgument) and touches no memory unless all are valid. Host
// copies run on the thread pool; CUDA copies are enqueued on `stream` (a cudaStream_t
// as an integer, 0 for the legacy default stream) and are asynchronous to the host.
Status CopyPages(Direction dir, const MemRef& cache, const KVGeometry& geometry,
                 const int64_t* block_ids, size_t num_ids, const SampleRef* samples,
                 size_t num_samples, int data_device, uint64_t stream);

// Host memcpy of many segments on the thread pool.
void CopySegmentsHost(const Segment* segs, size_t n);

}  // namespace rlboost::migration
