// Token bucket with reservations: a sender takes its tokens at once (possibly going into
// debt) and sleeps until the debt is repaid, so callers are served in arrival order.
#include "weights/rate_limiter.h"

#include <algorithm>

namespace rlboost {

RateLimiter::RateLimiter(uint64_t bytes_per_s)
    : rate_(static_cast<double>(bytes_per_s)), last_(Clock::now()) {
  // A 10 ms burst: enough to absorb scheduling jitter, too little to exceed the cap.
  burst_ = std::max(rate_ / 100.0, 16.0 * 1024);
  tokens_ = burst_;
}

bool RateLimiter::Acquire(size_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return false;
  auto now = Clock::now();
  tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
  last_ = now;
  tokens_ -= static_cast<double>(bytes);
  if (tokens_ >= 0) return true;
  auto until = now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(-tokens_ / rate_));
  cv_.wait_until(lock, until, [&] { return closed_; });
  return !closed_;
}

void RateLimiter::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace rlboost
