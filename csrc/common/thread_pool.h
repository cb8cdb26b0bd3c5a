// A small process-wide thread pool for memory-bound copies and checksums (migration
// batches and KV pages, the chunk checksums of a published version). The calling thread
// always takes part, so a job finishes even if the workers are busy with another
// caller's job (or were lost in a fork). Not for blocking I/O: it has a thread per core.
#pragma once

#include <cstddef>
#include <functional>

namespace rlboost {

// Threads that take part in ParallelFor (workers plus the caller).
size_t PoolThreads();

// Runs fn(i) for every i in [0, n) and returns when all calls are done. fn must not throw.
void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

}  // namespace rlboost
