// RateLimiter: a token bucket that caps a server's egress in bytes per second, so weight
// serving leaves the trainer's own traffic its share of the link (and so one machine can
// emulate per-host link speeds). Senders reserve tokens and wait out any debt, so
// concurrent senders are served in arrival order; one that gives up (its deadline, its
// receiver gone) gives its reservation back.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

#include "transport/transport.h"

namespace rlboost {

class RateLimiter : public Pacer {
 public:
  explicit RateLimiter(uint64_t bytes_per_s);
  Status Acquire(size_t bytes, Deadline d, const std::function<bool()>& gone) override;
  void Close();

 private:
  using Clock = std::chrono::steady_clock;
  std::mutex mu_;
  std::condition_variable cv_;
  double rate_;
  double burst_;
  double tokens_;
  Clock::time_point last_;
  bool closed_ = false;
};

}  // namespace rlboost
