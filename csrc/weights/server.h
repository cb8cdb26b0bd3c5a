// WeightServer: serves the versions of a VersionStore to authenticated pullers on one
// TCP port. One thread per connection; each connection's failures (a wrong secret, a
// malformed frame, a vanished peer) close that connection only. Pullers keep their
// connections open between pulls; when max_connections authenticated ones are open, the
// one idle longest is closed to admit a newcomer (its puller reconnects when it next
// needs it). Connections still in the handshake have caps of their own (in all and per
// peer host) and a short deadline; when full, the oldest of them is dropped, so silent
// sockets can neither fill the server nor keep authenticated pullers out.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"
#include "transport/transport.h"
#include "weights/rate_limiter.h"
#include "weights/version_store.h"

namespace rlboost {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  std::string secret;
  uint64_t egress_bytes_per_s = 0;  // 0: unlimited
  double handshake_timeout_s = 2.0;
  int max_handshakes = 128;          // connections still in the handshake, in all
  int max_handshakes_per_host = 32;  // ... and from one peer address
  double frame_timeout_s = 30.0;  // a started frame must finish within this
  double send_timeout_s = 300.0;  // one response, including pacing; and the longest a
                                  // connection holding a lease may go without a request
  int max_connections = 256;
  int ucx_port = 0;  // UCX listener (when built); 0: any free port
};

struct ServerStats {
  uint64_t bytes_sent = 0;
  uint64_t chunks_sent = 0;
  uint64_t not_held_replies = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // over max_connections, none of them idle
  uint64_t connections_evicted = 0;  // idle ones closed to admit a newcomer
  uint64_t handshakes_dropped = 0;   // unauthenticated ones closed to admit a newcomer
  uint64_t auth_failures = 0;
  uint64_t protocol_errors = 0;
  uint64_t active_connections = 0;
  uint64_t leases_expired = 0;  // connections closed for holding a lease unused too long
};

class WeightServer {
 public:
  static Status Start(const ServerOptions& opts, std::shared_ptr<VersionStore> store,
                      std::unique_ptr<WeightServer>* out);
  ~WeightServer();
  // Stops accepting, wakes and joins every connection thread. Idempotent. In a forked
  // child (which has none of the threads, and shares the sockets with the parent) it only
  // closes this process's descriptors, so the parent keeps serving.
  void Close();

  const std::string& host() const { return opts_.host; }
  int port() const { return port_; }
  uint64_t server_id() const { return self_.server_id; }
  ServerStats stats() const;

 private:
  struct Conn {
    Socket socket;
    std::thread thread;
    std::atomic<bool> done{false};
    std::atomic<bool> evicted{false};
    std::atomic<bool> authenticated{false};
    std::string peer_host;
    Deadline::Clock::time_point accepted_at;
    // Authenticated and waiting for its next request since idle_since (steady clock ns).
    // Whoever flips it from true to false (the connection's thread on a request, or an
    // eviction) owns what happens next.
    std::atomic<bool> idle{false};
    std::atomic<int64_t> idle_since{0};
    SessionKey session_key{};  // from the handshake: MACs this connection's manifest replies
  };

  WeightServer(const ServerOptions& opts, std::shared_ptr<VersionStore> store);
  void AcceptLoop();
  void Serve(Conn* conn);
  Status ServeFrames(Conn* conn);
  bool EvictIdleLocked();
  void DropHandshakesLocked(const std::string& host);
  bool AdmitAuthenticated(Conn* conn);
  Status Dispatch(const FrameHeader& h, const std::string& body, ServiceConnection& conn);
  Status ServeChunk(const FrameHeader& h, const std::string& body, Socket& s);
  Status ServeHave(const FrameHeader& h, const std::string& body, Socket& s);
  void ReapLocked();
  void AbandonInForkedChild();

  ServerOptions opts_;
  std::shared_ptr<VersionStore> store_;
  std::unique_ptr<RateLimiter> limiter_;
  std::vector<std::unique_ptr<TransportService>> services_;
  PeerIdentity self_;
  Socket listener_;
  int port_ = 0;
  pid_t owner_pid_ = 0;  // the process whose threads serve
  std::thread accept_thread_;
  std::atomic<bool> closing_{false};
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Conn>> conns_;

  std::atomic<uint64_t> bytes_sent_{0}, chunks_sent_{0}, not_held_{0}, accepted_{0}, refused_{0},
      evicted_{0}, dropped_{0}, auth_failures_{0}, protocol_errors_{0}, leases_expired_{0};
};

}  // namespace rlboost
