// The login stage: nonblocking accepts and logins over epoll, budgeted per address, with
// slots reserved for addresses that logged in successfully not long ago. Every epoll,
// fcntl and accept result is checked.
#include "channel/login_stage.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

#include "common/frame.h"

namespace rlboost {
namespace {

constexpr int kAcceptsPerRound = 1024;  // then pending logins get their turn
constexpr int kTickMs = 20;
constexpr size_t kMaxGoodHosts = 4096;
constexpr auto kOutOfDescriptorsPause = std::chrono::milliseconds(50);

Status ErrnoIo(const char* what) { return Status(Code::kIo, std::string(what) + ": " + std::strerror(errno)); }

std::string HostOf(const struct sockaddr_storage& addr, socklen_t len) {
  char host[NI_MAXHOST] = "";
  if (getnameinfo(reinterpret_cast<const struct sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

// Sends a whole small frame on a nonblocking socket, or fails: a peer whose receive
// window cannot take a hundred bytes is not worth waiting for.
bool SendNow(int fd, FrameType type, const std::string& body) {
  FrameHeader h;
  h.type = type;
  h.length = static_cast<uint32_t>(body.size());
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  std::string out(reinterpret_cast<const char*>(head), kFrameHeaderBytes);
  out += body;
  ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == static_cast<ssize_t>(out.size());
}

}  // namespace

struct LoginStage::Pending {
  uint64_t id = 0;
  Socket sock;
  std::string host;
  bool reserved = false;
  Deadline::Clock::time_point accepted;
  std::unique_ptr<ServerLogin> login;
  bool got_hello = false;
  FrameHeader header;
  std::string buf;
  std::list<std::unique_ptr<Pending>>::iterator self;
};

LoginStage::LoginStage(Socket& listener, std::string secret, PeerIdentity self, EncryptPolicy policy,
                       LoginLimits limits, LoginCounts* counts, OnLogin on_login)
    : listener_(listener), secret_(std::move(secret)), self_(self), policy_(policy), limits_(limits),
      on_login_(std::move(on_login)), counts_(counts) {}

Status LoginStage::Create(Socket& listener, std::string secret, PeerIdentity self, EncryptPolicy policy,
                          LoginLimits limits, LoginCounts* counts, OnLogin on_login, std::unique_ptr<LoginStage>* out) {
  if (limits.slots < 1 || limits.per_host < 1) {
    return Status(Code::kInvalidArgument, "login slots and slots per address must be >= 1, got " +
                                              std::to_string(limits.slots) + " and " + std::to_string(limits.per_host));
  }
  if (!(limits.timeout_s > 0) || !(limits.good_login_s >= 0)) {
    return Status(Code::kInvalidArgument, "the login timeout must be > 0 s");
  }
  std::unique_ptr<LoginStage> s(
      new LoginStage(listener, std::move(secret), self, policy, limits, counts, std::move(on_login)));
  s->epoll_ = epoll_create1(EPOLL_CLOEXEC);
  if (s->epoll_ < 0) return ErrnoIo("epoll_create1");
  RLB_RETURN_IF_ERROR(SetBlocking(listener.fd(), false));
  struct epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.u64 = 0;
  if (epoll_ctl(s->epoll_, EPOLL_CTL_ADD, listener.fd(), &ev) != 0) return ErrnoIo("epoll_ctl(listener)");
  *out = std::move(s);
  return Status::Ok();
}

LoginStage::~LoginStage() {
  by_id_.clear();
  pending_.clear();
  if (epoll_ >= 0) close(epoll_);
}

Status LoginStage::Run(const std::atomic<bool>& closing) {
  struct epoll_event events[256];
  while (!closing) {
    int n = epoll_wait(epoll_, events, 256, kTickMs);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoIo("epoll_wait");
    }
    if (closing) break;
    // Logins under way before newcomers: a burst of accepts must not delay the logins
    // that are one frame from done (an honest puller's among them).
    bool listener_ready = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.u64 == 0) {
        listener_ready = true;
        continue;
      }
      auto it = by_id_.find(events[i].data.u64);
      if (it != by_id_.end()) Step(it->second);  // gone already: dropped for a newcomer
    }
    if (!listener_watched_ && Deadline::Clock::now() >= accept_resume_) WatchListener(true);
    if (listener_ready) AcceptAll();
    Expire();
  }
  return Status::Ok();
}

void LoginStage::WatchListener(bool on) {
  struct epoll_event ev = {};
  ev.events = on ? static_cast<uint32_t>(EPOLLIN) : 0u;
  ev.data.u64 = 0;
  if (epoll_ctl(epoll_, EPOLL_CTL_MOD, listener_.fd(), &ev) == 0) listener_watched_ = on;
}

void LoginStage::SampleAcceptQueue() {
  // A listener's TCP_INFO reports its accept queue: tcpi_unacked connections waiting now.
  struct tcp_info info;
  socklen_t len = sizeof(info);
  if (getsockopt(listener_.fd(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return;
  uint64_t depth = info.tcpi_unacked;
  uint64_t peak = counts_->accept_queue_peak.load();
  while (depth > peak && !counts_->accept_queue_peak.compare_exchange_weak(peak, depth)) {
  }
}

void LoginStage::AcceptAll() {
  SampleAcceptQueue();
  for (int i = 0; i < kAcceptsPerRound; ++i) {
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    int fd = ::accept4(listener_.fd(), reinterpret_cast<struct sockaddr*>(&addr), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) {
      Admit(fd, HostOf(addr, len));
      continue;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    // Out of descriptors (or another failure): the listener stays readable, so stop
    // watching it for a moment rather than spin on it.
    ++counts_->accept_errors;
    accept_resume_ = Deadline::Clock::now() + kOutOfDescriptorsPause;
    WatchListener(false);
    return;
  }
}

void LoginStage::Admit(int fd, const std::string& host) {
  ++counts_->accepted;
  auto p = std::make_unique<Pending>();
  p->sock = Socket(fd);
  p->host = host;
  p->reserved = RecentlyGood(host);
  MakeRoom(host, p->reserved);
  p->id = next_id_++;
  p->accepted = Deadline::Clock::now();
  p->login = std::make_unique<ServerLogin>(secret_, self_, policy_, PeerIsLoopback(fd));
  struct epoll_event ev = {};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = p->id;
  if (epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    ++counts_->dropped;  // p closes its socket here
    return;
  }
  Pending* raw = p.get();
  pending_.push_back(std::move(p));
  raw->self = std::prev(pending_.end());
  by_id_[raw->id] = raw;
  ++per_host_[raw->host];
  ++pooled_[raw->reserved ? 1 : 0];
}

bool LoginStage::RecentlyGood(const std::string& host) {
  std::lock_guard<std::mutex> lock(good_mu_);
  auto it = good_.find(host);
  if (it == good_.end()) return false;
  if (std::chrono::duration<double>(Deadline::Clock::now() - it->second).count() <= limits_.good_login_s) return true;
  good_.erase(it);
  return false;
}

void LoginStage::MarkGood(const std::string& host) {
  std::lock_guard<std::mutex> lock(good_mu_);
  if (good_.size() >= kMaxGoodHosts && good_.count(host) == 0) good_.clear();  // a bound, should many hosts log in
  good_[host] = Deadline::Clock::now();
}

LoginStage::Pending* LoginStage::OldestWhere(const std::function<bool(const Pending&)>& in) const {
  for (auto& p : pending_) {
    if (in(*p)) return p.get();
  }
  return nullptr;
}

void LoginStage::MakeRoom(const std::string& host, bool reserved) {
  // The address's own oldest goes first, so one address cannot fill a pool; then the
  // pool's oldest. Reserved logins never make room in the other pool, nor it in theirs.
  auto it = per_host_.find(host);
  if (it != per_host_.end() && it->second >= limits_.per_host) {
    Drop(OldestWhere([&](const Pending& q) { return q.host == host; }));
    ++counts_->dropped;
  }
  if (pooled_[reserved ? 1 : 0] >= limits_.slots) {
    Drop(OldestWhere([&](const Pending& q) { return q.reserved == reserved; }));
    ++counts_->dropped;
  }
}

void LoginStage::Drop(Pending* p) {
  if (p == nullptr) return;
  epoll_ctl(epoll_, EPOLL_CTL_DEL, p->sock.fd(), nullptr);  // closing the socket removes it anyway
  auto it = per_host_.find(p->host);
  if (it != per_host_.end() && --it->second <= 0) per_host_.erase(it);
  --pooled_[p->reserved ? 1 : 0];
  by_id_.erase(p->id);
  pending_.erase(p->self);  // closes the socket
}

void LoginStage::Fail(Pending* p, const Status& st) {
  if (st.code() == Code::kAuth) ++counts_->auth_failures;
  if (st.code() == Code::kProtocol) ++counts_->protocol_errors;
  if (st.code() == Code::kAuth || st.code() == Code::kProtocol) {
    SendNow(p->sock.fd(), FrameType::kError, EncodeErrorBody(st));
  }
  Drop(p);
}

void LoginStage::Step(Pending* p) {
  char tmp[128];
  for (;;) {
    const size_t want = p->buf.size() < kFrameHeaderBytes ? kFrameHeaderBytes : kFrameHeaderBytes + p->header.length;
    if (p->buf.size() == want) {
      if (!Advance(p)) return;
      continue;
    }
    ssize_t n = ::recv(p->sock.fd(), tmp, std::min(sizeof(tmp), want - p->buf.size()), 0);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return Drop(p);
    if (n < 0) return;  // all there is for now
    p->buf.append(tmp, static_cast<size_t>(n));
    if (p->buf.size() != kFrameHeaderBytes) continue;
    Status st = DecodeFrameHeader(reinterpret_cast<const uint8_t*>(p->buf.data()), &p->header);
    const FrameType expected = p->got_hello ? FrameType::kAuth : FrameType::kHello;
    if (st.ok() && p->header.type != expected) {
      st = Status(Code::kProtocol, std::string("expected a ") + FrameTypeName(expected) + " frame, got " +
                                       FrameTypeName(p->header.type));
    }
    if (!st.ok()) return Fail(p, st);
  }
}

// A whole login frame has arrived: answers it. False when the login ended (either way).
bool LoginStage::Advance(Pending* p) {
  std::string body = p->buf.substr(kFrameHeaderBytes);
  p->buf.clear();
  if (!p->got_hello) {
    std::string challenge;
    Status st = p->login->OnHello(body, &challenge);
    if (!st.ok()) return Fail(p, st), false;
    if (!SendNow(p->sock.fd(), FrameType::kChallenge, challenge)) return Drop(p), false;
    p->got_hello = true;
    return true;
  }
  Status st = p->login->OnAuth(body);
  if (!st.ok()) return Fail(p, st), false;
  std::string welcome = p->login->Welcome();
  std::shared_ptr<FrameSeal> seal;
  st = p->login->Seal(&seal);
  if (st.ok()) st = SetBlocking(p->sock.fd(), true);
  if (!st.ok()) return Drop(p), false;
  const uint64_t client_id = p->login->client_id();
  std::string host = p->host;
  epoll_ctl(epoll_, EPOLL_CTL_DEL, p->sock.fd(), nullptr);
  Socket s = std::move(p->sock);
  Drop(p);  // its socket has moved out: nothing closes
  on_login_(std::move(s), client_id, host, welcome, std::move(seal));
  return false;
}

void LoginStage::Expire() {
  const auto now = Deadline::Clock::now();
  const auto limit = std::chrono::duration_cast<Deadline::Clock::duration>(std::chrono::duration<double>(limits_.timeout_s));
  // Oldest first: the first one still within its deadline ends the sweep.
  while (!pending_.empty() && now - pending_.front()->accepted > limit) {
    ++counts_->timed_out;
    Drop(pending_.front().get());
  }
}

}  // namespace rlboost
