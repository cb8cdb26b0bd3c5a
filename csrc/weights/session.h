// SourceSession: the puller's authenticated control connection to one source. It asks
// for manifests and held-chunk bitmaps and carries transports' control requests; bulk
// bytes travel on the transport's own streams. With a ConnectionPool the connection is
// taken from and given back to it, so consecutive pulls do not connect again. Calls are
// serialized: a long poll (FetchHave with a wait) belongs on a session of its own.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "channel/connection_pool.h"
#include "channel/socket.h"
#include "transport/transport.h"
#include "weights/manifest.h"
#include "weights/version_store.h"

namespace rlboost {

// The default bound on a version's payload: larger announcements are refused before
// anything is allocated for them (transfer.max_version_bytes).
constexpr uint64_t kDefaultMaxVersionBytes = uint64_t{1} << 40;

struct SessionOptions {
  std::string secret;
  EncryptPolicy encrypt = EncryptPolicy::kAuto;
  uint64_t max_version_bytes = kDefaultMaxVersionBytes;
};

// The largest manifest body a version of at most max_version_bytes needs (smallest
// chunks, one tag each, and a tensor table of a few hundred bytes per MiB), within the
// format's own bound.
uint64_t MaxManifestBody(uint64_t max_version_bytes);

class SourceSession : public SourceLink {
 public:
  // pool may be null (then the connection closes with the session). server_id: the
  // server this must reach (0: any); another one there (the source restarted) is kPeerLost.
  // interrupt (may be null): see set_interrupt().
  static Status Open(const std::string& host, int port, const SessionOptions& opts,
                     std::shared_ptr<ConnectionPool> pool, uint64_t server_id, Interrupt* interrupt,
                     Deadline d, std::unique_ptr<SourceSession>* out);
  // Gives a healthy connection back to the pool.
  ~SourceSession() override;

  Status FetchManifest(int64_t version, Manifest* out, Deadline d);  // -1 = latest
  // The source's held chunks; waits up to wait_ms on the source for a generation newer
  // than `known`.
  Status FetchHave(int64_t version, uint64_t known, uint32_t wait_ms, HeldState* out, Deadline d);

  const std::string& host() const override { return host_; }
  int port() const override { return port_; }
  const std::string& secret() const override { return opts_.secret; }
  EncryptPolicy encrypt() const override { return opts_.encrypt; }
  const PeerIdentity& peer() const override { return peer_; }
  Status Call(FrameType request, const std::string& body, FrameType response,
              FrameHeader* reply_header, std::string* reply, Deadline d) override;
  Status Notify(FrameType request, const std::string& body, Deadline d) override;
  // Once `interrupt` fires, a call in progress ends at once and later calls fail; the
  // connection is then closed instead of given back. Set before calls from other threads.
  void set_interrupt(Interrupt* interrupt) { interrupt_ = interrupt; }
  // Closes the connection instead of giving it back (the source holds state on it).
  void Discard() { broken_ = true; }

 private:
  SourceSession(std::string host, int port, SessionOptions opts, std::shared_ptr<ConnectionPool> pool)
      : host_(std::move(host)), port_(port), opts_(std::move(opts)), pool_(std::move(pool)) {}
  Status CallOnce(FrameType request, const std::string& body, FrameType response,
                  FrameHeader* reply_header, std::string* reply, Deadline d);
  std::string host_;
  int port_;
  SessionOptions opts_;
  std::shared_ptr<ConnectionPool> pool_;
  PeerIdentity peer_;
  std::mutex mu_;  // one call at a time
  Interrupt* interrupt_ = nullptr;
  Socket socket_;
  uint64_t next_id_ = 0;
  bool reused_ = false;             // the connection came from the pool ...
  bool proven_ = false;             // ... and has answered a request since
  std::atomic<bool> broken_{false};  // out of step, closed or interrupted: never reused
};

}  // namespace rlboost
