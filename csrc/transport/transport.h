// Transport: how chunk bytes move from one source into local memory. Every transport
// has a client half (ChunkStream: ordered lanes of chunk reads, written straight into
// the destination and hashed on the way, for the chunk's tag) and an optional server half
// (TransportService: answers that transport's control requests on the authenticated
// TCP connection). Capability queries let the puller choose one per source.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/frame.h"
#include "common/polyval.h"
#include "common/status.h"
#include "channel/connection_pool.h"
#include "channel/handshake.h"

namespace rlboost {

struct TransportCaps {
  bool same_host_only = false;       // the source must share this host's memory
  bool needs_shared_region = false;  // the source's region must live in shared memory
  bool source_cpu_free = false;      // the source's CPU does no per-chunk work
  bool device_memory = false;        // can write into GPU memory
  // The source keeps what it leased for this transport until the control connection
  // closes: that connection must not be kept open for later pulls.
  bool leases_until_disconnect = false;
};

struct ChunkRead {
  int64_t version = 0;
  uint32_t index = 0;
  uint64_t offset = 0;  // within the version's payload
  uint32_t length = 0;
  uint8_t* dst = nullptr;  // where the chunk's bytes go (already offset)
  const PolyvalKey* hash_key = nullptr;  // the version's (weights/chunk_tag.h)
  // Filled in by Complete():
  ReplyStatus reply = ReplyStatus::kOk;
  Block128 digest{};  // POLYVAL of the bytes written to dst, under hash_key
};

// One ordered lane of chunk reads from one source, driven by one thread.
class ChunkStream {
 public:
  virtual ~ChunkStream() = default;
  virtual Status Submit(const ChunkRead& read, Deadline d) = 0;
  // Finishes the oldest submitted read (FIFO) and fills its reply and digest.
  virtual Status Complete(ChunkRead* read, Deadline d) = 0;
  // Makes a blocked Submit/Complete in another thread return promptly.
  virtual void Abort() = 0;
  // True when the stream failed before delivering anything over a connection kept from
  // an earlier pull (the source had closed it while idle): the caller reconnects without
  // counting a failure.
  virtual bool stale() const { return false; }
};

// The control connection to one source, as transports see it.
class SourceLink {
 public:
  virtual ~SourceLink() = default;
  virtual const std::string& host() const = 0;
  virtual int port() const = 0;
  virtual const std::string& secret() const = 0;
  virtual EncryptPolicy encrypt() const = 0;
  virtual const PeerIdentity& peer() const = 0;
  // One request/response on the control connection (serialized with other calls).
  virtual Status Call(FrameType request, const std::string& body, FrameType response,
                      FrameHeader* reply_header, std::string* reply, Deadline d) = 0;
  // A request with no response.
  virtual Status Notify(FrameType request, const std::string& body, Deadline d) = 0;
};

// Asks a source for `version`'s region over a transport's control request (shm-open,
// ucx-open): the reply body on success; kUnknownVersion when the source does not hold it,
// kInvalidArgument (saying `unavailable`) when it cannot serve it over this transport.
Status RequestRegion(SourceLink& link, FrameType request, FrameType response, int64_t version,
                     const char* unavailable, Deadline d, std::string* reply);

struct StreamOptions {
  double connect_timeout_s = 10.0;
  uint64_t region_bytes = 0;  // payload size of the version
  ConnectionPool* pool = nullptr;  // idle connections to reuse and give back (null: none)
  Interrupt* interrupt = nullptr;  // abandons a connect or handshake in progress (null: none)
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual TransportCaps caps() const = 0;
  // Whether this transport can reach a source with that identity at all.
  virtual bool Reaches(const PeerIdentity& source) const = 0;
  virtual Status OpenStream(SourceLink& link, int64_t version, const StreamOptions& opts,
                            std::unique_ptr<ChunkStream>* out) = 0;
};

// ---- server side ----------------------------------------------------------------

// A pinned range of a published version; the pin keeps it from being freed or reused.
struct ChunkLease {
  const uint8_t* data = nullptr;
  uint32_t length = 0;
  std::shared_ptr<void> pin;
};

struct RegionLease {
  uint8_t* data = nullptr;
  uint64_t size = 0;
  int fd = -1;  // shareable file descriptor, or -1
  std::shared_ptr<void> pin;
};

// Paces a server's egress (a token bucket).
class Pacer {
 public:
  virtual ~Pacer() = default;
  // Blocks until `bytes` may be sent. Not OK when the pacer closed (kClosed), when the
  // wait would pass `d` (kTimeout) or when gone() says the receiver left (kPeerLost,
  // asked at least every few tens of milliseconds): the bytes are then given back, so
  // nobody waits for what is never sent.
  virtual Status Acquire(size_t bytes, Deadline d, const std::function<bool()>& gone) = 0;
};

// What a weight server exposes to transport services.
class ServingBackend {
 public:
  virtual ~ServingBackend() = default;
  virtual ReplyStatus LeaseChunk(int64_t version, uint32_t index, ChunkLease* out) = 0;
  // A region lease may be revoked (its version retired beyond what is kept): `revoke`
  // then ends the connection that holds it, which releases the lease.
  virtual ReplyStatus LeaseRegion(int64_t version, const std::function<void()>& revoke, RegionLease* out) = 0;
};

// Per-connection state a service may keep (leases live until the connection ends).
struct ServiceConnection {
  Socket* socket = nullptr;
  uint64_t request_id = 0;
  std::vector<std::pair<int64_t, RegionLease>> region_leases;
  std::vector<std::shared_ptr<void>> state;  // anything else a service keeps per connection
  std::function<void()> revoke;              // ends this connection (for LeaseRegion)
  size_t leases() const { return region_leases.size() + state.size(); }
};

// Where a server's services may listen (a transport with its own listener binds here).
struct ServiceOptions {
  std::string host = "127.0.0.1";
  int ucx_port = 0;  // 0: any free port
};

class TransportService {
 public:
  virtual ~TransportService() = default;
  virtual bool Handles(FrameType type) const = 0;
  // Answers one request. A non-OK Status closes the connection.
  virtual Status Handle(const FrameHeader& h, const std::string& body, ServiceConnection& conn,
                        ServingBackend& backend, Deadline d) = 0;
};

// ---- registry --------------------------------------------------------------------

// Names of the transports built into this module ("tcp", "shm", and "ucx" when found).
std::vector<std::string> BuiltTransports();
// For transfer.transport "auto": of the built transports that reach `source` and serve
// any region (not device memory only), the one that costs the source least (its CPU free
// first), else TCP, which reaches every source.
std::unique_ptr<Transport> ChooseTransport(const PeerIdentity& source);
// What a pull falls back to when `failed` cannot serve a source after all (its region is
// not shareable, or its egress is capped): the transport every source serves.
std::unique_ptr<Transport> FallbackTransport(const Transport& failed);
// A fresh client-side transport by name; kInvalidArgument for an unknown or unbuilt one.
Status MakeTransport(const std::string& name, std::unique_ptr<Transport>* out);
// Server-side services for every built transport that needs one.
std::vector<std::unique_ptr<TransportService>> MakeTransportServices(const ServiceOptions& opts);

}  // namespace rlboost
