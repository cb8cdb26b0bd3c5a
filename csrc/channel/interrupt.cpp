// Registered sockets are shut down, never closed: their owners close them as usual.
#include "channel/interrupt.h"

#include <sys/socket.h>

#include <algorithm>

namespace rlboost {

void Interrupt::Fire() {
  std::lock_guard<std::mutex> lock(mu_);
  fired_ = true;
  for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);  // wakes recv, send and a connect's poll
}

bool Interrupt::fired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fired_;
}

bool Interrupt::Add(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fired_) return false;
  fds_.push_back(fd);
  return true;
}

void Interrupt::Remove(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find(fds_.begin(), fds_.end(), fd);
  if (it != fds_.end()) fds_.erase(it);
}

InterruptScope::InterruptScope(Interrupt* interrupt, const Socket& s)
    : interrupt_(interrupt), fd_(s.fd()) {
  if (interrupt_ == nullptr || fd_ < 0) {
    interrupt_ = nullptr;
    return;
  }
  if (!interrupt_->Add(fd_)) {
    ::shutdown(fd_, SHUT_RDWR);
    interrupt_ = nullptr;
  }
}

InterruptScope::~InterruptScope() {
  if (interrupt_ != nullptr) interrupt_->Remove(fd_);
}

}  // namespace rlboost
