// Workers pull indices from the oldest unfinished job; callers run their own job too.
#include "common/thread_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <new>
#include <thread>

namespace rlboost {
namespace {

// Memory bandwidth saturates with a few threads; more only add contention.
constexpr size_t kMaxThreads = 8;

struct Job {
  const std::function<void(size_t)>* fn = nullptr;
  size_t n = 0;
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::mutex mu;
  std::condition_variable finished;

  // Runs indices until none are left; returns once this thread has nothing more to do.
  void Work() {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      (*fn)(i);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        finished.notify_all();
      }
    }
  }
};

class Pool {
 public:
  explicit Pool(size_t workers) : workers_(workers) {
    for (size_t i = 0; i < workers; ++i) std::thread([this] { Loop(); }).detach();
  }

  size_t threads() const { return workers_ + 1; }

  void Run(size_t n, const std::function<void(size_t)>& fn) {
    auto job = std::make_shared<Job>();
    job->fn = &fn;
    job->n = n;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(job);
    }
    wake_.notify_all();
    job->Work();
    {
      std::unique_lock<std::mutex> lock(job->mu);
      job->finished.wait(lock, [&] { return job->done.load() == n; });
    }
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), job), jobs_.end());
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return !jobs_.empty(); });
        // Drop jobs whose indices are all taken; their callers wait for completion.
        while (!jobs_.empty() && jobs_.front()->next.load() >= jobs_.front()->n) {
          jobs_.pop_front();
        }
        if (jobs_.empty()) continue;
        job = jobs_.front();
      }
      job->Work();
    }
  }

  size_t workers_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> jobs_;
};

std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mu;

// A forked child has none of the parent's threads, and may have inherited g_pool_mu
// locked by one of them: start over (the old pool is leaked; its workers are not here).
void ForgetPoolAfterFork() {
  g_pool.store(nullptr);
  new (&g_pool_mu) std::mutex();
}

Pool& GetPool() {
  Pool* pool = g_pool.load();
  if (pool != nullptr) return *pool;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (g_pool.load() == nullptr) {
    static std::once_flag atfork_once;
    std::call_once(atfork_once, [] { pthread_atfork(nullptr, nullptr, ForgetPoolAfterFork); });
    size_t hw = std::max<size_t>(1, std::thread::hardware_concurrency());
    // Deliberately never freed: detached workers may still wait on it at exit.
    g_pool.store(new Pool(std::min(hw, kMaxThreads) - 1));
  }
  return *g_pool.load();
}

}  // namespace

size_t PoolThreads() { return GetPool().threads(); }

void ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  GetPool().Run(n, fn);
}

}  // namespace rlboost
