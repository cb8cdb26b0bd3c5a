// Blocking TCP sockets with deadlines; errors map onto Code so callers see PeerLost,
// TransferTimeout or a plain I/O error.
#include "channel/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "channel/frame_seal.h"
#include "channel/interrupt.h"

namespace rlboost {
namespace {

Status ErrnoStatus(const char* what, int err) {
  std::string msg = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case ECONNABORTED:
    case ESHUTDOWN:
      return Status(Code::kPeerLost, msg);
    case EAGAIN:
    case ETIMEDOUT:
      return Status(Code::kTimeout, msg);
    default:
      return Status(Code::kIo, msg);
  }
}

Status ResolveOne(const std::string& host, int port, bool passive, struct addrinfo** out) {
  struct addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  std::string port_s = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, out);
  if (rc != 0) {
    return Status(Code::kInvalidArgument, "cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return Status::Ok();
}

Status PeerClosed() { return Status(Code::kPeerLost, "peer closed the connection mid-frame"); }

constexpr int kLoopbackSendBuffer = 1 << 20;  // the kernel doubles it for its bookkeeping
constexpr int kDeferAcceptSeconds = 5;  // see ListenTcp


}  // namespace

bool PeerIsLoopback(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) return false;
  if (ss.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_addr.s_addr) >> 24) == 127;
  }
  if (ss.ss_family != AF_INET6) return false;
  const struct in6_addr& a = reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&a) || (IN6_IS_ADDR_V4MAPPED(&a) && a.s6_addr[12] == 127);
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    seal_ = std::move(o.seal_);
    o.fd_ = -1;
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  seal_.reset();
}

void Socket::Shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Status Socket::ApplyTimeout(int option, Deadline d) {
  struct timeval tv = {0, 0};
  if (!d.never()) {
    double s = d.RemainingSeconds();
    if (s <= 0) return Status(Code::kTimeout, "deadline passed");
    s = std::max(s, 0.001);
    tv.tv_sec = static_cast<time_t>(s);
    tv.tv_usec = static_cast<suseconds_t>((s - std::floor(s)) * 1e6);
  }
  if (setsockopt(fd_, SOL_SOCKET, option, &tv, sizeof(tv)) != 0) {
    return ErrnoStatus("setsockopt(timeout)", errno);
  }
  return Status::Ok();
}

Status Socket::AfterFailedCall(int option, const char* what, Deadline d) {
  if (errno == EINTR) return Status::Ok();
  if (errno != EAGAIN && errno != EWOULDBLOCK) return ErrnoStatus(what, errno);
  // The per-call timeout fired: go on while the request's deadline allows.
  if (d.Expired()) return Status(Code::kTimeout, std::string(what) + " did not finish before the request deadline");
  return ApplyTimeout(option, d);
}

Status Socket::SendAll(const void* data, size_t n, Deadline d) {
  struct iovec iov = {const_cast<void*>(data), n};
  return SendV(&iov, 1, d);
}

Status Socket::SendV(struct iovec* iov, int iovcnt, Deadline d) {
  if (fd_ < 0) return Status(Code::kClosed, "socket is closed");
  RLB_RETURN_IF_ERROR(ApplyTimeout(SO_SNDTIMEO, d));
  while (iovcnt > 0) {
    if (d.Expired()) return Status(Code::kTimeout, "send did not finish before the deadline");
    if (iov->iov_len == 0) {
      ++iov;
      --iovcnt;
      continue;
    }
    struct msghdr msg;
    std::memset(&msg, 0, sizeof(msg));
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(iovcnt);
    ssize_t sent = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0) {
      RLB_RETURN_IF_ERROR(AfterFailedCall(SO_SNDTIMEO, "send", d));
      continue;
    }
    size_t left = static_cast<size_t>(sent);
    while (iovcnt > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --iovcnt;
    }
    if (iovcnt > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
      // A partial send: the next call may wait only for what is left of the deadline.
      RLB_RETURN_IF_ERROR(ApplyTimeout(SO_SNDTIMEO, d));
    }
  }
  return Status::Ok();
}

Status Socket::RecvAll(void* data, size_t n, Deadline d) {
  if (fd_ < 0) return Status(Code::kClosed, "socket is closed");
  auto* p = static_cast<char*>(data);
  RLB_RETURN_IF_ERROR(ApplyTimeout(SO_RCVTIMEO, d));
  while (n > 0) {
    ssize_t got = ::recv(fd_, p, n, MSG_WAITALL);
    if (got == 0) return PeerClosed();
    if (got < 0) {
      RLB_RETURN_IF_ERROR(AfterFailedCall(SO_RCVTIMEO, "recv", d));
      continue;
    }
    p += got;
    n -= static_cast<size_t>(got);
    // A short read (the timeout fired with part of the bytes, or a signal): a peer that
    // trickles must not get the full timeout again.
    if (n > 0) RLB_RETURN_IF_ERROR(ApplyTimeout(SO_RCVTIMEO, d));
  }
  return Status::Ok();
}

Status Socket::RecvSome(void* data, size_t n, size_t* got, Deadline d) {
  if (fd_ < 0) return Status(Code::kClosed, "socket is closed");
  RLB_RETURN_IF_ERROR(ApplyTimeout(SO_RCVTIMEO, d));
  while (true) {
    ssize_t r = ::recv(fd_, data, n, 0);
    if (r > 0) {
      *got = static_cast<size_t>(r);
      return Status::Ok();
    }
    if (r == 0) return PeerClosed();
    RLB_RETURN_IF_ERROR(AfterFailedCall(SO_RCVTIMEO, "recv", d));
  }
}

bool Socket::WaitReadable(Deadline d) {
  while (true) {
    struct pollfd pfd = {fd_, POLLIN, 0};
    int ms = -1;
    if (!d.never()) ms = static_cast<int>(std::min(d.RemainingSeconds() * 1000.0, 1e9));
    int rc = ::poll(&pfd, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return true;  // let the following recv report the error
  }
}

bool Socket::HungUp() const {
  struct pollfd pfd = {fd_, POLLRDHUP, 0};
  return ::poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

Status TuneForBulk(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return ErrnoStatus("setsockopt(TCP_NODELAY)", errno);
  }
  // A loopback path has no round trip to cover, so deep send buffers only hold more bytes
  // in flight, which then leave the cache before the receiver copies them (measured: ~1.5x
  // the throughput of 4 streams with a 1 MiB cap). Remote peers keep kernel autotuning,
  // which sizes the buffer to the path's bandwidth-delay product.
  if (PeerIsLoopback(fd)) {
    int bytes = kLoopbackSendBuffer;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)) != 0) {
      return ErrnoStatus("setsockopt(SO_SNDBUF)", errno);
    }
  }
  return Status::Ok();
}

Status SetBlocking(int fd, bool blocking) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return ErrnoStatus("fcntl(F_GETFL)", errno);
  flags = blocking ? (flags & ~O_NONBLOCK) : (flags | O_NONBLOCK);
  if (fcntl(fd, F_SETFL, flags) != 0) return ErrnoStatus("fcntl(F_SETFL)", errno);
  return Status::Ok();
}

Status ConnectTcp(const std::string& host, int port, Deadline d, Socket* out, Interrupt* interrupt) {
  struct addrinfo* res = nullptr;
  RLB_RETURN_IF_ERROR(ResolveOne(host, port, false, &res));
  Status last(Code::kPeerLost, "no address for " + host);
  for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      last = ErrnoStatus("socket", errno);
      continue;
    }
    Status nonblocking = SetBlocking(s.fd(), false);
    if (!nonblocking.ok()) {
      last = nonblocking;
      continue;
    }
    int rc = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    // Registered once the connect has begun: a shutdown before that would not abort it.
    InterruptScope scope(interrupt, s);
    if (rc != 0 && err == EINPROGRESS) {
      struct pollfd pfd = {s.fd(), POLLOUT, 0};
      // Clamped: a far deadline would overflow int, a passed one must not mean "forever".
      int ms = d.never() ? -1 : static_cast<int>(std::clamp(d.RemainingSeconds() * 1000.0, 0.0, 1e9));
      int prc;
      do {
        prc = ::poll(&pfd, 1, ms);
      } while (prc < 0 && errno == EINTR);
      if (prc == 0) {
        last = Status(Code::kTimeout, "connect to " + host + ":" + std::to_string(port) + " timed out");
        continue;
      }
      socklen_t len = sizeof(err);
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      rc = err == 0 ? 0 : -1;
    }
    if (interrupt != nullptr && interrupt->fired()) {
      freeaddrinfo(res);
      return Status(Code::kClosed, "connect to " + host + ":" + std::to_string(port) + " interrupted");
    }
    if (rc != 0) {
      last = Status(Code::kPeerLost, "connect to " + host + ":" + std::to_string(port) +
                                         " failed: " + std::strerror(err));
      continue;
    }
    Status tuned = SetBlocking(s.fd(), true);
    if (tuned.ok()) tuned = TuneForBulk(s.fd());
    if (!tuned.ok()) {
      last = tuned;
      continue;
    }
    *out = std::move(s);
    freeaddrinfo(res);
    return Status::Ok();
  }
  freeaddrinfo(res);
  return last;
}

Status ListenTcp(const std::string& host, int port, Socket* out, int* bound_port) {
  struct addrinfo* res = nullptr;
  RLB_RETURN_IF_ERROR(ResolveOne(host, port, true, &res));
  Status last(Code::kIo, "no address to bind for " + host);
  for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) continue;
    int one = 1;
    if (setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0) {
      last = ErrnoStatus("setsockopt(SO_REUSEADDR)", errno);
      continue;
    }
    // Clients speak first (their hello), so the kernel hands over a connection only once its
    // first bytes arrive (or kDeferAcceptSeconds pass): connections held open without a
    // byte wait in the kernel's handshake queue instead of filling the accept queue, where
    // they would crowd out honest logins.
    int defer = kDeferAcceptSeconds;
    if (setsockopt(s.fd(), IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof(defer)) != 0) {
      last = ErrnoStatus("setsockopt(TCP_DEFER_ACCEPT)", errno);
      continue;
    }
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s.fd(), SOMAXCONN) != 0) {
      int err = errno;
      last = Status(Code::kIo, "cannot listen on " + host + ":" + std::to_string(port) + ": " +
                                   std::strerror(err) +
                                   (err == EADDRINUSE ? " (another server holds this port; port 0 picks a free one)" : ""));
      continue;
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (getsockname(s.fd(), reinterpret_cast<struct sockaddr*>(&ss), &len) != 0) {
      last = ErrnoStatus("getsockname", errno);
      continue;
    }
    *bound_port = ss.ss_family == AF_INET6
                      ? ntohs(reinterpret_cast<struct sockaddr_in6*>(&ss)->sin6_port)
                      : ntohs(reinterpret_cast<struct sockaddr_in*>(&ss)->sin_port);
    *out = std::move(s);
    freeaddrinfo(res);
    return Status::Ok();
  }
  freeaddrinfo(res);
  return last;
}

}  // namespace rlboost
