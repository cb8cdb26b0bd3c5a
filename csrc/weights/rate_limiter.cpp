// Token bucket with reservations: a sender takes its tokens at once (possibly going into
// debt) and sleeps until the debt is repaid, so callers are served in arrival order.
#include "weights/rate_limiter.h"

#include <algorithm>

namespace rlboost {
namespace {

// How often a waiting sender asks whether its receiver is still there.
constexpr std::chrono::milliseconds kAliveCheck{20};

}  // namespace

RateLimiter::RateLimiter(uint64_t bytes_per_s)
    : rate_(static_cast<double>(bytes_per_s)), last_(Clock::now()) {
  // A 10 ms burst: enough to absorb scheduling jitter, too little to exceed the cap.
  burst_ = std::max(rate_ / 100.0, 16.0 * 1024);
  tokens_ = burst_;
}

Status RateLimiter::Acquire(size_t bytes, Deadline d, const std::function<bool()>& gone) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) return Status(Code::kClosed, "server closing");
  auto now = Clock::now();
  tokens_ = std::min(burst_, tokens_ + rate_ * std::chrono::duration<double>(now - last_).count());
  last_ = now;
  tokens_ -= static_cast<double>(bytes);
  if (tokens_ >= 0) return Status::Ok();
  auto until = now + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(-tokens_ / rate_));
  Status st;
  if (!d.never() && d.at() < until) {
    st = Status(Code::kTimeout, "egress cap: the send would not start before its deadline");
  }
  while (st.ok() && Clock::now() < until) {
    auto slice = std::min(until, Clock::now() + kAliveCheck);
    if (cv_.wait_until(lock, slice, [&] { return closed_; })) {
      st = Status(Code::kClosed, "server closing");
    } else if (gone && gone()) {
      st = Status(Code::kPeerLost, "the receiver left before its bytes were sent");
    }
  }
  // Given back: later senders' waits were computed against a debt that now shrinks.
  if (!st.ok()) tokens_ += static_cast<double>(bytes);
  return st;
}

void RateLimiter::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace rlboost
