// Shared-memory chunk streams (client) and region leases (server).
#include "transport/shm/shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>

#include "common/bytes.h"
#include "common/polyval.h"
#include "transport/shm/shm_region.h"
#include "channel/frame_io.h"

namespace rlboost {
namespace {

// Payloads at least this large are written with streaming stores: they are far larger
// than the cache, and the engine reads them later, not the puller now.
constexpr uint64_t kStreamingBytes = 32u << 20;
constexpr size_t kMaxLeasesPerConnection = 16;

class ShmChunkStream : public ChunkStream {
 public:
  ShmChunkStream(std::shared_ptr<SharedMapping> m, bool streaming)
      : mapping_(std::move(m)), streaming_(streaming) {}

  Status Submit(const ChunkRead& read, Deadline) override {
    pending_.push_back(read);
    return Status::Ok();
  }

  Status Complete(ChunkRead* read, Deadline) override {
    if (pending_.empty()) return Status(Code::kInternal, "complete without a submitted read");
    pending_.pop_front();
    if (read->offset + read->length > mapping_->size()) {
      return Status(Code::kProtocol, "chunk lies outside the shared region");
    }
    // One pass: the hash is taken from the bytes as they are copied.
    Polyval hash(*read->hash_key);
    hash.UpdateCopy(read->dst, mapping_->data() + read->offset, read->length, streaming_);
    read->digest = hash.Finish();
    read->reply = ReplyStatus::kOk;
    return Status::Ok();
  }

  void Abort() override {}

 private:
  std::shared_ptr<SharedMapping> mapping_;
  bool streaming_;
  std::deque<ChunkRead> pending_;
};

class ShmTransport : public Transport {
 public:
  // Ends the source's lease, even if the region could not be mapped: the control
  // connection may be kept for later pulls, and the lease would pin the version.
  ~ShmTransport() override {
    for (int i = 0; i < leases_; ++i) {
      link_->Notify(FrameType::kShmClose, EncodeVersionBody(version_), Deadline::After(1.0));
    }
  }
  const char* name() const override { return "shm"; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.same_host_only = true;
    c.needs_shared_region = true;
    c.source_cpu_free = true;
    return c;
  }
  bool Reaches(const PeerIdentity& source) const override {
    return source.host_key == LocalHostKey();
  }

  Status OpenStream(SourceLink& link, int64_t version, const StreamOptions& opts,
                    std::unique_ptr<ChunkStream>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (mapping_ == nullptr) RLB_RETURN_IF_ERROR(MapRegion(link, version, opts));
    if (version != version_) return Status(Code::kInternal, "one shm transport per version");
    *out = std::make_unique<ShmChunkStream>(mapping_, opts.region_bytes >= kStreamingBytes);
    return Status::Ok();
  }

 private:
  Status MapRegion(SourceLink& link, int64_t version, const StreamOptions& opts) {
    std::string reply;
    RLB_RETURN_IF_ERROR(RequestRegion(link, FrameType::kShmOpenRequest, FrameType::kShmOpen, version,
                                      "source does not serve this version over shared memory (its "
                                      "region is borrowed memory, or its egress is capped)",
                                      Deadline::After(opts.connect_timeout_s), &reply));
    link_ = &link;  // the source holds a lease from here on
    version_ = version;
    ++leases_;
    ByteReader r(reinterpret_cast<const uint8_t*>(reply.data()), reply.size());
    uint32_t pid = 0, fd = 0;
    uint64_t size = 0;
    RLB_RETURN_IF_ERROR(r.U32(&pid));
    RLB_RETURN_IF_ERROR(r.U32(&fd));
    RLB_RETURN_IF_ERROR(r.U64(&size));
    RLB_RETURN_IF_ERROR(r.ExpectEnd());
    if (size < opts.region_bytes) return Status(Code::kProtocol, "shared region is too small");
    RLB_RETURN_IF_ERROR(SharedMapping::OpenRemote(pid, static_cast<int>(fd), opts.region_bytes, &mapping_));
    return Status::Ok();
  }

  std::mutex mu_;
  std::shared_ptr<SharedMapping> mapping_;
  SourceLink* link_ = nullptr;
  int64_t version_ = -1;
  int leases_ = 0;  // granted by the source, each ended by one close
};

class ShmService : public TransportService {
 public:
  bool Handles(FrameType t) const override {
    return t == FrameType::kShmOpenRequest || t == FrameType::kShmClose;
  }

  Status Handle(const FrameHeader& h, const std::string& body, ServiceConnection& conn,
                ServingBackend& backend, Deadline d) override {
    int64_t version;
    RLB_RETURN_IF_ERROR(DecodeVersionBody(body, &version));
    auto& leases = conn.region_leases;
    if (h.type == FrameType::kShmClose) {
      auto it = std::find_if(leases.begin(), leases.end(),
                             [&](const auto& l) { return l.first == version; });
      if (it != leases.end()) leases.erase(it);
      return Status::Ok();
    }
    RegionLease lease;
    ReplyStatus st = backend.LeaseRegion(version, conn.revoke, &lease);
    if (st == ReplyStatus::kOk && lease.fd < 0) st = ReplyStatus::kUnavailable;
    if (st == ReplyStatus::kOk && leases.size() >= kMaxLeasesPerConnection) {
      return Status(Code::kProtocol, "too many shared-memory leases on one connection");
    }
    std::string reply;
    if (st == ReplyStatus::kOk) {
      ByteWriter w(&reply);
      w.U32(static_cast<uint32_t>(getpid()));
      w.U32(static_cast<uint32_t>(lease.fd));
      w.U64(lease.size);
      leases.emplace_back(version, std::move(lease));
    }
    return SendFrame(*conn.socket, FrameType::kShmOpen, static_cast<uint32_t>(st),
                     h.request_id, reply, d);
  }
};

}  // namespace

std::unique_ptr<Transport> MakeShmTransport() { return std::make_unique<ShmTransport>(); }
std::unique_ptr<TransportService> MakeShmService() { return std::make_unique<ShmService>(); }

}  // namespace rlboost
