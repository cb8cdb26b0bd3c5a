// Interrupt: ends, from another thread, the blocking socket calls of one operation (a
// pull). A call registers its socket for as long as it may block; Fire() shuts down every
// registered socket, and any registered later at once, so a call that begins just after
// the operation ended cannot block either. Sockets not registered (idle kept connections)
// are left alone, so a finished pull still gives its healthy connections back.
#pragma once

#include <mutex>
#include <vector>

#include "channel/socket.h"

namespace rlboost {

class Interrupt {
 public:
  void Fire();
  bool fired() const;

 private:
  friend class InterruptScope;
  // False when already fired (the caller then shuts the socket down itself).
  bool Add(int fd);
  void Remove(int fd);

  mutable std::mutex mu_;
  bool fired_ = false;
  std::vector<int> fds_;
};

// Registers a socket with an interrupt (null: none) while this scope lives. The socket
// must stay open for the scope's lifetime, so a fired interrupt never touches a reused fd.
class InterruptScope {
 public:
  InterruptScope(Interrupt* interrupt, const Socket& s);
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  Interrupt* interrupt_;
  int fd_;
};

}  // namespace rlboost
