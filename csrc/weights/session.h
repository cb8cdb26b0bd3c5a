// SourceSession: the puller's authenticated control connection to one source. It asks
// for manifests and held-chunk bitmaps and carries transports' control requests; bulk
// bytes travel on the transport's own streams.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "transport/tcp/socket.h"
#include "transport/transport.h"
#include "weights/manifest.h"
#include "weights/version_store.h"

namespace rlboost {

class SourceSession : public SourceLink {
 public:
  static Status Open(const std::string& host, int port, const std::string& secret, Deadline d,
                     std::unique_ptr<SourceSession>* out);

  Status FetchManifest(int64_t version, Manifest* out, Deadline d);  // -1 = latest
  // The source's held chunks; waits up to wait_ms on the source for a generation newer
  // than `known`.
  Status FetchHave(int64_t version, uint64_t known, uint32_t wait_ms, HeldState* out, Deadline d);

  const std::string& host() const override { return host_; }
  int port() const override { return port_; }
  const std::string& secret() const override { return secret_; }
  const PeerIdentity& peer() const override { return peer_; }
  Status Call(FrameType request, const std::string& body, FrameType response,
              FrameHeader* reply_header, std::string* reply, Deadline d) override;
  Status Notify(FrameType request, const std::string& body, Deadline d) override;
  // Unblocks a call in progress (used when a pull is cancelled).
  void Abort() { socket_.Shutdown(); }

 private:
  SourceSession(std::string host, int port, std::string secret)
      : host_(std::move(host)), port_(port), secret_(std::move(secret)) {}
  std::string host_;
  int port_;
  std::string secret_;
  PeerIdentity peer_;
  std::mutex mu_;
  Socket socket_;
  uint64_t next_id_ = 0;
};

}  // namespace rlboost
