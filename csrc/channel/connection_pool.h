// ConnectionPool: authenticated TCP connections to sources, kept open between pulls, so
// a pull of a small payload (a migration batch) does not pay again for connecting and
// the HMAC handshake. A connection is given back only between frames (nothing
// outstanding, no error seen); one the server closed while it sat idle is readable (end
// of stream) and is dropped when taken, and one idle for too long is closed. A forked
// child never takes its parent's connections (their seal state is the parent's: reusing
// it would repeat a frame counter, an AES-GCM nonce): it connects anew.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "common/deadline.h"
#include "channel/handshake.h"
#include "channel/interrupt.h"
#include "channel/socket.h"

namespace rlboost {

class ConnectionPool {
 public:
  ConnectionPool(size_t max_idle_per_source, double max_idle_s);

  // An idle connection to host:port, to the server `server_id` (0: any); false if none.
  bool Take(const std::string& host, int port, uint64_t server_id, Socket* out, PeerIdentity* peer);
  // Keeps a healthy connection for later pulls (closes it when the pool is full or closed).
  void Give(const std::string& host, int port, Socket s, const PeerIdentity& peer);
  // Closes every idle connection; later Give() calls close theirs at once.
  void Close();
  size_t idle() const;

 private:
  struct Idle {
    std::string host;
    int port;
    Socket socket;
    PeerIdentity peer;
    Deadline::Clock::time_point since;
  };
  void DropExpiredLocked();
  // In a forked child: forgets the parent's connections (closing only this process's
  // descriptors) so the child never speaks on them, and starts afresh as the child's pool.
  void ForgetInheritedLocked();

  const size_t max_idle_per_source_;
  const double max_idle_s_;
  mutable std::mutex mu_;
  std::deque<Idle> idle_;  // oldest first
  bool closed_ = false;
  pid_t owner_;  // the process whose connections these are
};

// An authenticated connection to a source: taken from `pool` when one is idle (reused),
// else connected and authenticated now (`interrupt`, may be null, abandons that at once).
struct Connection {
  Socket socket;
  PeerIdentity peer;
  bool reused = false;
};

Status ConnectAuthenticated(ConnectionPool* pool, const std::string& host, int port,
                            const std::string& secret, EncryptPolicy encrypt, uint64_t server_id,
                            Deadline d, Connection* out, Interrupt* interrupt = nullptr);

}  // namespace rlboost
