// WeightServer: serves the versions of a VersionStore to authenticated pullers on one
// TCP port. Logins are stepped by one thread for all of them, with budgets per address and
// slots kept for addresses that logged in recently (channel/login_stage.h); each
// authenticated connection then has a thread of its own. A connection's failures (a wrong
// secret, a malformed or unauthentic frame, a vanished peer) close that connection only.
// Every login and every frame has a deadline for the whole of it. Authenticated
// connections are capped in all, per client process and per peer address;
// when a newcomer would pass a cap, a connection stalled mid-frame, idle or long-polling
// goes first (server_conn.h). A connection holding a region lease closes when the lease
// expires or is revoked (version_store.h), so no peer pins memory for long.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "channel/handshake.h"
#include "channel/login_stage.h"
#include "channel/socket.h"
#include "transport/transport.h"
#include "weights/rate_limiter.h"
#include "weights/server_conn.h"
#include "weights/version_store.h"

namespace rlboost {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  std::string secret;
  uint64_t egress_bytes_per_s = 0;  // 0: unlimited
  double handshake_timeout_s = 2.0;  // the whole login
  double frame_timeout_s = 30.0;     // a started request frame, whole
  double send_timeout_s = 300.0;     // one response, including pacing
  double lease_timeout_s = 60.0;     // the longest a connection may hold a region lease
  AdmissionLimits limits;
  int ucx_port = 0;  // UCX listener (when built); 0: any free port
  EncryptPolicy encrypt = EncryptPolicy::kAuto;  // transfer.encrypt (frame_seal.h)
};

struct ServerStats {
  uint64_t bytes_sent = 0;
  uint64_t chunks_sent = 0;
  uint64_t not_held_replies = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;  // newcomers turned away: no connection could go
  uint64_t connections_evicted = 0;  // idle or long-polling ones closed to admit a newcomer
  uint64_t stalled_evicted = 0;      // ones stalled mid-frame closed to admit a newcomer
  uint64_t handshakes_dropped = 0;   // unauthenticated ones closed to admit a newcomer
  uint64_t deadlines_missed = 0;     // logins and frames that did not finish in time
  uint64_t auth_failures = 0;
  uint64_t protocol_errors = 0;
  uint64_t active_connections = 0;
  uint64_t leases_expired = 0;  // connections closed because their lease ran out
  uint64_t leases_revoked = 0;  // ... because the leased version was retired
  uint64_t encrypted_connections = 0;  // logins whose frames are sealed (AES-256-GCM)
  uint64_t accept_queue_peak = 0;      // deepest the kernel's accept queue was seen
  uint64_t accept_errors = 0;          // accept() failures (out of descriptors, ...)
  uint64_t resource_errors = 0;        // connections ended because memory ran out
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
  WeightServer(const ServerOptions& opts, std::shared_ptr<VersionStore> store);
  void AcceptLoop();
  void OnLogin(Socket s, uint64_t client_id, const std::string& host, const std::string& welcome,
               std::shared_ptr<FrameSeal> seal);
  void Serve(const std::shared_ptr<ServerConn>& conn, const std::string& welcome, std::shared_ptr<FrameSeal> seal);
  void ServeGuarded(const std::shared_ptr<ServerConn>& conn, const std::string& welcome,
                    std::shared_ptr<FrameSeal> seal);
  Status ServeFrames(const std::shared_ptr<ServerConn>& conn);
  Status Dispatch(const FrameHeader& h, const std::string& body, ServerConn* c, ServiceConnection& conn);
  Status ServeChunk(const FrameHeader& h, const std::string& body, Socket& s);
  Status ServeHave(const FrameHeader& h, const std::string& body, ServerConn* c);
  void ReapLocked();
  void AbandonInForkedChild();

  ServerOptions opts_;
  std::shared_ptr<VersionStore> store_;
  std::unique_ptr<RateLimiter> limiter_;
  std::vector<std::unique_ptr<TransportService>> services_;
  PeerIdentity self_;
  Socket listener_;
  int port_ = 0;
  pid_t owner_pid_ = getpid();  // the process that made this server (a Start that fails closes in it too)
  std::unique_ptr<LoginStage> stage_;  // made by Start (its failures are Start's), run by accept_thread_
  std::thread accept_thread_;
  std::atomic<bool> closing_{false};
  mutable std::mutex mu_;
  ConnList conns_;
  AdmissionCounts admission_;  // guarded by mu_
  LoginCounts logins_;

  std::atomic<uint64_t> bytes_sent_{0}, chunks_sent_{0}, not_held_{0}, deadlines_missed_{0},
      auth_failures_{0}, protocol_errors_{0}, leases_expired_{0}, leases_revoked_{0},
      encrypted_{0}, resource_errors_{0};
};

}  // namespace rlboost
