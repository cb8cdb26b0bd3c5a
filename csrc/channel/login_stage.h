// LoginStage: the logins of one weight server, driven without a thread each. One thread
// accepts connections and steps their logins (hello -> challenge -> auth -> welcome) as
// bytes arrive, over epoll, so a flood of connections costs an accept and a few bytes
// each, not a thread. Pending logins are budgeted before any proof is checked:
// - per address: one address holds at most `per_host` of them; its oldest goes for its newest;
// - in all: at most `slots` from addresses without a recent good login, the oldest first;
// - reserved: addresses with a good login within `good_login_s` wait in slots of their own
//   (as many again), which logins from other addresses never take, so a flood from many
//   addresses cannot evict an honest puller's next login. A login is good only once its
//   connection has sent a request that verified under the login's keys (MarkGood, called
//   by the server): a relay that passes an honest client's login along earns nothing.
// The accept queue is drained whole each round (up to kAcceptsPerRound) with a cheap
// accept path, so holders of many connections cannot keep it full; its peak depth is
// counted. A login that is not whole within the deadline is closed. A proven client is
// handed to `on_login` with its socket (blocking again), client id, address, the welcome to
// send and the seal to put on the socket once it is sent.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "channel/handshake.h"
#include "channel/socket.h"
#include "common/deadline.h"

namespace rlboost {

struct LoginLimits {
  int slots = 128;             // pending logins from addresses without a recent good login
  int per_host = 32;           // pending logins from one address
  double timeout_s = 2.0;      // a login must finish within this of its accept
  double good_login_s = 600;   // how long a good login reserves slots for its address
};

struct LoginCounts {
  std::atomic<uint64_t> accepted{0}, dropped{0}, timed_out{0}, auth_failures{0}, protocol_errors{0};
  std::atomic<uint64_t> accept_errors{0};       // accept() failures (out of descriptors, ...)
  std::atomic<uint64_t> accept_queue_peak{0};   // deepest the kernel's accept queue was seen
};

class LoginStage {
 public:
  using OnLogin = std::function<void(Socket s, uint64_t client_id, const std::string& host,
                                     const std::string& welcome, std::shared_ptr<FrameSeal> seal)>;
  // kInvalidArgument for limits below 1; kIo when epoll or the listener cannot be set up.
  static Status Create(Socket& listener, std::string secret, PeerIdentity self, EncryptPolicy policy,
                       LoginLimits limits, LoginCounts* counts, OnLogin on_login, std::unique_ptr<LoginStage>* out);
  ~LoginStage();
  // Runs until `closing` is set (checked every few tens of milliseconds); not OK when
  // epoll itself fails.
  Status Run(const std::atomic<bool>& closing);
  // A connection from `host` sent a request that verified under its login's keys: the
  // address earns reserved slots. Any thread.
  void MarkGood(const std::string& host);

 private:
  struct Pending;
  LoginStage(Socket& listener, std::string secret, PeerIdentity self, EncryptPolicy policy, LoginLimits limits,
             LoginCounts* counts, OnLogin on_login);
  void AcceptAll();
  void Admit(int fd, const std::string& host);
  void WatchListener(bool on);
  void SampleAcceptQueue();
  void Step(Pending* p);
  bool Advance(Pending* p);
  void Drop(Pending* p);
  void Fail(Pending* p, const Status& st);
  void Expire();
  bool RecentlyGood(const std::string& host);
  void MakeRoom(const std::string& host, bool reserved);
  Pending* OldestWhere(const std::function<bool(const Pending&)>& in) const;

  Socket& listener_;
  const std::string secret_;
  const PeerIdentity self_;
  const EncryptPolicy policy_;
  const LoginLimits limits_;
  OnLogin on_login_;
  int epoll_ = -1;
  bool listener_watched_ = true;
  Deadline::Clock::time_point accept_resume_{};  // after running out of descriptors
  std::list<std::unique_ptr<Pending>> pending_;  // oldest first
  std::unordered_map<uint64_t, Pending*> by_id_;  // epoll's key of each
  std::unordered_map<std::string, int> per_host_;  // pending logins per address
  int pooled_[2] = {0, 0};                          // pending logins: unreserved, reserved
  uint64_t next_id_ = 1;                            // 0 is the listener
  std::mutex good_mu_;                              // guards good_ (MarkGood runs elsewhere)
  std::unordered_map<std::string, Deadline::Clock::time_point> good_;  // address -> last good login
  LoginCounts* counts_;
};

}  // namespace rlboost
