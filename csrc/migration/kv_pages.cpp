// Page copies are planned as a list of contiguous segments, checked up front, then run
// on the host thread pool or as one CUDA kernel.
#include "migration/kv_pages.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "migration/stream_copy.h"
#include "migration/wire.h"
#ifdef RLBOOST_HAS_CUDA
#include "migration/kv_pages_cuda.h"
#endif

namespace rlboost::migration {
namespace {

// Segments are cut to this size so a merged run of blocks still spreads over threads
// (and CUDA thread blocks); host tasks group pieces up to kTaskBytes.
constexpr uint64_t kPieceBytes = 256 << 10;
constexpr uint64_t kTaskBytes = 1 << 20;
constexpr uint64_t kStreamingBytes = uint64_t{64} << 20;
constexpr uint64_t kPrefetchBytes = 4096;

std::string SampleMsg(size_t i, const std::string& what) {
  return "sample " + std::to_string(i) + ": " + what;
}

bool Overlaps(uint64_t a, uint64_t an, uint64_t b, uint64_t bn) {
  return an != 0 && bn != 0 && a < b + bn && b < a + an;
}

Status CheckGeometry(const MemRef& cache, const KVGeometry& g, uint64_t* token_bytes) {
  constexpr uint64_t kMaxDim = uint64_t{1} << 40;
  for (uint64_t v : {g.num_layers, g.num_blocks, g.block_size, g.row_bytes}) {
    if (v < 1 || v > kMaxDim) return ArgErr("KV geometry values must be in [1, 2**40]");
  }
  uint64_t plane_bytes, cache_bytes, tb, cache_end;
  if (!MulAdd(g.num_blocks, g.block_size, 0, &plane_bytes) ||
      !MulAdd(plane_bytes, g.row_bytes, 0, &plane_bytes) ||
      !MulAdd(plane_bytes, 2 * g.num_layers, 0, &cache_bytes) ||
      !MulAdd(2 * g.num_layers, g.row_bytes, 0, &tb)) {
    return ArgErr("KV geometry overflows 64-bit sizes");
  }
  if (cache_bytes != cache.nbytes) {
    return ArgErr("cache holds " + std::to_string(cache.nbytes) + " bytes but the layout needs " +
                  std::to_string(cache_bytes));
  }
  if (cache.addr == 0 || __builtin_add_overflow(cache.addr, cache.nbytes, &cache_end)) {
    return ArgErr("cache address range is invalid");
  }
  *token_bytes = tb;
  return Status::Ok();
}

Status CheckSample(Direction dir, const KVGeometry& g, uint64_t token_bytes,
                   const int64_t* ids, size_t num_ids, const SampleRef& s, size_t index,
                   std::vector<bool>* written) {
  uint64_t end, capacity, nbytes, data_end;
  if (__builtin_add_overflow(s.table_offset, s.table_len, &end) || end > num_ids) {
    return ArgErr(SampleMsg(index, "block table lies outside the block id array"));
  }
  if (!MulAdd(s.table_len, g.block_size, 0, &capacity) || s.kv_tokens > capacity) {
    return ArgErr(SampleMsg(index, "kv_tokens " + std::to_string(s.kv_tokens) + " exceeds " +
                                       std::to_string(s.table_len) + " blocks of " +
                                       std::to_string(g.block_size) + " tokens"));
  }
  if (!MulAdd(s.kv_tokens, token_bytes, 0, &nbytes) || nbytes != s.data_nbytes) {
    return ArgErr(SampleMsg(index, "data holds " + std::to_string(s.data_nbytes) +
                                       " bytes but kv_tokens needs " + std::to_string(nbytes)));
  }
  if (s.data_nbytes != 0 && s.data_addr == 0) return ArgErr(SampleMsg(index, "data address is null"));
  if (__builtin_add_overflow(s.data_addr, s.data_nbytes, &data_end)) {
    return ArgErr(SampleMsg(index, "data range wraps around"));
  }
  uint64_t used = (s.kv_tokens + g.block_size - 1) / g.block_size;
  for (uint64_t j = 0; j < s.table_len; ++j) {
    int64_t b = ids[s.table_offset + j];
    if (b < 0 || static_cast<uint64_t>(b) >= g.num_blocks) {
      return ArgErr(SampleMsg(index, "block id " + std::to_string(b) + " is outside [0, " +
                                         std::to_string(g.num_blocks) + ")"));
    }
    // Two scattered pages landing in one block would race and lose tokens.
    if (dir == Direction::kScatter && j < used) {
      if ((*written)[b]) return ArgErr(SampleMsg(index, "block id " + std::to_string(b) + " is written twice"));
      (*written)[b] = true;
    }
  }
  return Status::Ok();
}

void AddSegment(std::vector<Segment>* segs, uint64_t src, uint64_t dst, uint64_t len) {
  if (!segs->empty()) {
    Segment& last = segs->back();
    // Consecutive block ids are adjacent in the cache: one copy instead of many.
    if (last.src + last.len == src && last.dst + last.len == dst) {
      last.len += len;
      return;
    }
  }
  segs->push_back({src, dst, len});
}

std::vector<Segment> Plan(Direction dir, uint64_t cache_addr, const KVGeometry& g,
                          const int64_t* ids, const SampleRef* samples, size_t n) {
  std::vector<Segment> segs;
  const uint64_t row = g.row_bytes, bs = g.block_size;
  for (size_t i = 0; i < n; ++i) {
    const SampleRef& s = samples[i];
    const uint64_t used = (s.kv_tokens + bs - 1) / bs;
    for (uint64_t p = 0; p < 2 * g.num_layers; ++p) {
      for (uint64_t j = 0; j < used; ++j) {
        uint64_t block = static_cast<uint64_t>(ids[s.table_offset + j]);
        uint64_t cache_at = cache_addr + ((p * g.num_blocks + block) * bs) * row;
        uint64_t data_at = s.data_addr + (p * s.kv_tokens + j * bs) * row;
        uint64_t len = std::min(bs, s.kv_tokens - j * bs) * row;
        if (dir == Direction::kGather) {
          AddSegment(&segs, cache_at, data_at, len);
        } else {
          AddSegment(&segs, data_at, cache_at, len);
        }
      }
    }
  }
  std::vector<Segment> pieces;
  pieces.reserve(segs.size());
  for (const Segment& s : segs) {
    for (uint64_t off = 0; off < s.len; off += kPieceBytes) {
      pieces.push_back({s.src + off, s.dst + off, std::min(kPieceBytes, s.len - off)});
    }
  }
  return pieces;
}

void PrefetchHead(uint64_t addr, uint64_t len) {
  const uint64_t n = std::min<uint64_t>(len, kPrefetchBytes);
  for (uint64_t off = 0; off < n; off += 64) __builtin_prefetch(reinterpret_cast<const void*>(addr + off));
}

}  // namespace

void CopySegmentsHost(const Segment* segs, size_t n) {
  // Task t covers pieces [starts[t], starts[t + 1]).
  std::vector<size_t> starts{0};
  uint64_t acc = 0;
  for (size_t i = 0; i < n; ++i) {
    acc += segs[i].len;
    if (acc >= kTaskBytes) {
      starts.push_back(i + 1);
      acc = 0;
    }
  }
  if (starts.back() != n) starts.push_back(n);
  // Copies larger than the last-level cache gain from bypassing it on the write side;
  // small ones are usually read right away (checksummed, sent) and should stay cached.
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += segs[i].len;
  const bool streaming = total >= kStreamingBytes;
  ParallelFor(starts.size() - 1, [&](size_t t) {
    for (size_t i = starts[t]; i < starts[t + 1]; ++i) {
      // Pages of a block table are scattered: start fetching the next one while copying
      // this one, since hardware prefetchers only catch up a while into each new stream.
      if (i + 1 < starts[t + 1]) PrefetchHead(segs[i + 1].src, segs[i + 1].len);
      void* dst = reinterpret_cast<void*>(segs[i].dst);
      const void* src = reinterpret_cast<const void*>(segs[i].src);
      if (streaming) {
        StreamingCopy(dst, src, segs[i].len);
      } else {
        std::memcpy(dst, src, segs[i].len);
      }
    }
    if (streaming) StreamingFence();
  });
}

Status CopyPages(Direction dir, const MemRef& cache, const KVGeometry& g, const int64_t* ids,
                 size_t num_ids, const SampleRef* samples, size_t num_samples, int data_device,
                 uint64_t stream) {
  uint64_t token_bytes = 0;
  RLB_RETURN_IF_ERROR(CheckGeometry(cache, g, &token_bytes));
  if (cache.device == kHostDevice && data_device != kHostDevice) {
    return ArgErr("a host cache needs host data buffers");
  }
  if (cache.device != kHostDevice && data_device != kHostDevice && data_device != cache.device) {
    return ArgErr("data must be on the cache's device or in pinned host memory");
  }
  std::vector<bool> written(dir == Direction::kScatter ? g.num_blocks : 0, false);
  for (size_t i = 0; i < num_samples; ++i) {
    const SampleRef& s = samples[i];
    RLB_RETURN_IF_ERROR(CheckSample(dir, g, token_bytes, ids, num_ids, s, i, &written));
    if (data_device == cache.device && Overlaps(s.data_addr, s.data_nbytes, cache.addr, cache.nbytes)) {
      return ArgErr(SampleMsg(i, "data overlaps the cache"));
    }
  }
  if (cache.device == kHostDevice) {
    std::vector<Segment> segs = Plan(dir, cache.addr, g, ids, samples, num_samples);
    CopySegmentsHost(segs.data(), segs.size());
    return Status::Ok();
  }
#ifdef RLBOOST_HAS_CUDA
  std::vector<SampleRef> resolved(samples, samples + num_samples);
  if (data_device == kHostDevice) {
    for (SampleRef& s : resolved) {
      if (s.data_nbytes == 0) continue;
      RLB_RETURN_IF_ERROR(DevicePointerForHost(cache.device, s.data_addr, &s.data_addr));
    }
  }
  std::vector<Segment> segs = Plan(dir, cache.addr, g, ids, resolved.data(), num_samples);
  return CopySegmentsCuda(cache.device, segs.data(), segs.size(), stream);
#else
  (void)stream;
  return ArgErr("this build of rlboost has no CUDA kernels (nvcc was not found at build time)");
#endif
}

}  // namespace rlboost::migration
