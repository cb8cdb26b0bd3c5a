// ServerConn: one connection of a weight server as its bookkeeping sees it (who, in which
// state since when), and the admission rules that choose whom to close when a newcomer
// would pass a cap: one stalled mid-frame (or mid-response) past min_stall_s first, then
// the one idle longest (idle past min_stall_s), then the one long-polling longest, and
// last, of those busy or idle for less than min_stall_s, the one in its state longest. A
// peer that stalls, trickles or hoards connections, authenticated or not, so loses its own
// connections first and cannot keep an honest puller out.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "common/deadline.h"
#include "channel/handshake.h"
#include "channel/socket.h"

namespace rlboost {

enum class ConnState : int {
  kHandshake,  // not authenticated yet
  kIdle,       // between frames: waits for the client's next request
  kWaiting,    // the server waits on its own account (a long poll of held chunks)
  kBusy,       // a frame is arriving or a response is being sent: the peer sets the pace
  kClosing,    // evicted, revoked or ending
};

struct ServerConn {
  Socket socket;
  std::thread thread;
  std::string peer_host;
  uint64_t peer_id = 0;  // the client's process (its hello), once authenticated
  Deadline::Clock::time_point accepted_at;
  std::atomic<bool> done{false};
  std::atomic<bool> evicted{false};
  std::atomic<bool> authenticated{false};
  std::atomic<int> state{static_cast<int>(ConnState::kHandshake)};
  std::atomic<int64_t> since_ns{0};  // steady clock: when `state` began

  ConnState current() const { return static_cast<ConnState>(state.load()); }
  double InStateFor() const;
  void Enter(ConnState s);
  // kIdle -> to; false when someone else moved it first (an eviction).
  bool LeaveIdle(ConnState to);
  // Closes the connection from another thread: its own thread sees the shutdown and ends.
  void Evict();
};

struct AdmissionLimits {
  int max_connections = 256;           // authenticated, in all
  int max_connections_per_peer = 96;   // ... of one client process
  int max_connections_per_host = 192;  // ... from one address
  int max_handshakes = 128;            // unauthenticated, in all
  int max_handshakes_per_host = 32;    // ... from one address
  double min_stall_s = 0.5;            // busy (stalled) or idle this long before it goes first
};

struct AdmissionCounts {
  uint64_t refused = 0;          // newcomers turned away: nobody could go
  uint64_t evicted_idle = 0;     // idle or long-polling connections closed for a newcomer
  uint64_t evicted_stalled = 0;  // busy ones (the most stalled) closed for one
};

// Shared: a region lease's revoke callback holds a weak reference to its connection, so
// it can never reach one that was reaped.
using ConnList = std::list<std::shared_ptr<ServerConn>>;

// Under the server's lock: makes room for `c` (authenticated now, client `peer_id`)
// within every cap; false only when no connection there can be closed.
bool AdmitLocked(ConnList& conns, ServerConn* c, uint64_t peer_id, const AdmissionLimits& lim,
                 AdmissionCounts* counts);
}  // namespace rlboost
