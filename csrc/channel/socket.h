// Socket: a blocking TCP socket with deadline-bounded send and receive. Blocking calls
// (MSG_WAITALL, one sendmsg per frame) keep the syscall count per chunk small; the
// deadline is applied through SO_RCVTIMEO / SO_SNDTIMEO, re-armed with what is left of it
// after every partial transfer, so a peer trickling bytes cannot stretch a deadline
// (it bounds the whole frame, not each read). Shutdown() wakes a thread blocked in any
// call so servers and pullers can close promptly.
#pragma once

#include <sys/uio.h>

#include <memory>
#include <string>

#include "common/deadline.h"
#include "common/status.h"

namespace rlboost {

class Interrupt;
class FrameSeal;

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { Close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_), seal_(std::move(o.seal_)) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close();
  // Wakes any thread blocked on this socket; the fd stays open until Close().
  void Shutdown();

  Status SendAll(const void* data, size_t n, Deadline d);
  // Gathers iov in as few sendmsg calls as the kernel allows; iov is consumed.
  Status SendV(struct iovec* iov, int iovcnt, Deadline d);
  Status RecvAll(void* data, size_t n, Deadline d);
  // Receives what has arrived (at least one byte, at most n) into data, waiting no longer
  // than the deadline.
  Status RecvSome(void* data, size_t n, size_t* got, Deadline d);
  // Waits until the socket is readable (or closed); false when the deadline passed.
  bool WaitReadable(Deadline d);
  // True when the peer has closed its side or the connection failed; never blocks.
  bool HungUp() const;
  // The login's frame seal (frame_seal.h): null until the login ends. It travels with the
  // socket (into and out of a connection pool), so every frame on it stays bound to it.
  FrameSeal* seal() const { return seal_.get(); }
  void set_seal(std::shared_ptr<FrameSeal> seal) { seal_ = std::move(seal); }

 private:
  Status ApplyTimeout(int option, Deadline d);
  // After a send/recv returned -1: OK to call again (interrupted, or a per-call timeout
  // inside the deadline), else the error.
  Status AfterFailedCall(int option, const char* what, Deadline d);
  int fd_ = -1;
  std::shared_ptr<FrameSeal> seal_;
};

// interrupt (may be null): firing it abandons the connect at once (kClosed).
Status ConnectTcp(const std::string& host, int port, Deadline d, Socket* out,
                  Interrupt* interrupt = nullptr);
// Binds only the given address (never a wildcard unless asked for one explicitly).
Status ListenTcp(const std::string& host, int port, Socket* out, int* bound_port);
// Whether the connection's peer is this machine's loopback (127/8, ::1).
bool PeerIsLoopback(int fd);
// TCP_NODELAY, and a shallow send buffer toward loopback peers.
Status TuneForBulk(int fd);
// Sets or clears O_NONBLOCK.
Status SetBlocking(int fd, bool blocking);

}  // namespace rlboost
