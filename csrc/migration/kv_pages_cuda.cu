// One kernel launch performs every page copy of a gather or scatter: each thread block
// takes whole segments and moves them in 16-byte words when alignment allows.
#include <cuda_runtime.h>

#include <string>

#include "migration/kv_pages_cuda.h"

namespace rlboost::migration {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;

__global__ void CopySegmentsKernel(const Segment* segs, size_t n) {
  for (size_t s = blockIdx.x; s < n; s += gridDim.x) {
    const Segment g = segs[s];
    const char* src = reinterpret_cast<const char*>(g.src);
    char* dst = reinterpret_cast<char*>(g.dst);
    if (((g.src | g.dst | g.len) & 15) == 0) {
      const uint4* s4 = reinterpret_cast<const uint4*>(src);
      uint4* d4 = reinterpret_cast<uint4*>(dst);
      for (size_t i = threadIdx.x; i < g.len / 16; i += blockDim.x) d4[i] = s4[i];
    } else {
      for (size_t i = threadIdx.x; i < g.len; i += blockDim.x) dst[i] = src[i];
    }
  }
}

Status CudaErr(cudaError_t err, const char* what) {
  return Status(Code::kIo, std::string(what) + ": " + cudaGetErrorString(err));
}

// Restores the caller's current device when the copy is enqueued.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    status_ = cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  cudaError_t status() const { return status_; }

 private:
  int previous_ = 0;
  cudaError_t status_ = cudaSuccess;
};

}  // namespace

Status DevicePointerForHost(int device, uint64_t addr, uint64_t* device_addr) {
  DeviceScope scope(device);
  if (scope.status() != cudaSuccess) return CudaErr(scope.status(), "cudaSetDevice");
  cudaPointerAttributes attrs{};
  cudaError_t err = cudaPointerGetAttributes(&attrs, reinterpret_cast<const void*>(addr));
  if (err != cudaSuccess || attrs.type != cudaMemoryTypeHost || attrs.devicePointer == nullptr) {
    cudaGetLastError();  // clear the sticky error of a failed query
    return Status(Code::kInvalidArgument,
                  "host data for a CUDA cache must be pinned (torch.Tensor.pin_memory())");
  }
  *device_addr = reinterpret_cast<uint64_t>(attrs.devicePointer);
  return Status::Ok();
}

Status CopySegmentsCuda(int device, const Segment* segs, size_t n, uint64_t stream) {
  if (n == 0) return Status::Ok();
  DeviceScope scope(device);
  if (scope.status() != cudaSuccess) return CudaErr(scope.status(), "cudaSetDevice");
  cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
  const size_t bytes = n * sizeof(Segment);
  void* table = nullptr;
  cudaError_t err = cudaMallocAsync(&table, bytes, s);
  if (err != cudaSuccess) return CudaErr(err, "cudaMallocAsync");
  // From pageable memory this returns once the table is staged, so `segs` may be freed.
  err = cudaMemcpyAsync(table, segs, bytes, cudaMemcpyHostToDevice, s);
  if (err == cudaSuccess) {
    const unsigned blocks = static_cast<unsigned>(n < kMaxBlocks ? n : kMaxBlocks);
    CopySegmentsKernel<<<blocks, kThreads, 0, s>>>(static_cast<const Segment*>(table), n);
    err = cudaGetLastError();
  }
  cudaError_t free_err = cudaFreeAsync(table, s);
  if (err != cudaSuccess) return CudaErr(err, "KV page copy kernel");
  if (free_err != cudaSuccess) return CudaErr(free_err, "cudaFreeAsync");
  return Status::Ok();
}

}  // namespace rlboost::migration
