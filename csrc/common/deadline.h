// Deadline: an absolute point on the monotonic clock, so a request's time budget is not
// reset by each partial read or retry inside it.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>

namespace rlboost {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  static Deadline After(double seconds) {
    if (!(seconds < 1e9)) return Never();
    if (seconds < 0) seconds = 0;
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds)));
  }
  static Deadline Never() { return Deadline(Clock::time_point::max()); }

  bool never() const { return at_ == Clock::time_point::max(); }
  bool Expired() const { return !never() && Clock::now() >= at_; }
  double RemainingSeconds() const {
    if (never()) return std::numeric_limits<double>::infinity();
    double s = std::chrono::duration<double>(at_ - Clock::now()).count();
    return s > 0 ? s : 0;
  }
  Clock::time_point at() const { return at_; }
  // The earlier of two deadlines.
  Deadline Min(const Deadline& o) const { return o.at_ < at_ ? o : *this; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace rlboost
