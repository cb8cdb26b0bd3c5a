// TCP chunk streams (client) and chunk sending (server).
#include "transport/tcp/tcp_transport.h"

#include <algorithm>
#include <atomic>
#include <deque>

#include "common/bytes.h"
#include "common/polyval.h"
#include "transport/tcp/frame_io.h"

namespace rlboost {
namespace {

// Received bytes are hashed in pieces this large, while they are still in L2.
constexpr size_t kRecvPiece = 512u << 10;
// Egress pacing granularity: small enough that an abandoned send stops costing tokens
// quickly, large enough that pacing costs few syscalls.
constexpr size_t kPacedPieceBytes = 256u << 10;

std::string ChunkPrefix(int64_t version, uint32_t index) {
  std::string b;
  ByteWriter w(&b);
  w.I64(version);
  w.U32(index);
  w.U32(0);
  return b;
}

class TcpChunkStream : public ChunkStream {
 public:
  TcpChunkStream(Connection c, ConnectionPool* pool, std::string host, int port)
      : sock_(std::move(c.socket)), peer_(c.peer), reused_(c.reused), pool_(pool),
        host_(std::move(host)), port_(port) {}

  // A stream with nothing outstanding and no error is between frames: kept for reuse.
  ~TcpChunkStream() override {
    if (pool_ != nullptr && !broken_ && pending_.empty()) pool_->Give(host_, port_, std::move(sock_), peer_);
  }

  Status Submit(const ChunkRead& read, Deadline d) override {
    std::string body;
    ByteWriter w(&body);
    w.I64(read.version);
    w.U32(read.index);
    pending_.push_back(++next_id_);
    return Checked(SendFrame(sock_, FrameType::kChunkRequest, 0, next_id_, body, d));
  }

  Status Complete(ChunkRead* read, Deadline d) override {
    if (pending_.empty()) return Status(Code::kInternal, "complete without a submitted read");
    uint64_t want_id = pending_.front();
    pending_.pop_front();
    Status st = Checked(Receive(want_id, read, d));
    if (st.ok()) proven_ = true;
    return st;
  }

  void Abort() override {
    broken_ = true;
    sock_.Shutdown();
  }

  bool stale() const override { return reused_ && !proven_ && broken_; }

 private:
  Status Checked(Status st) {
    if (!st.ok()) broken_ = true;  // whatever failed, the byte stream is out of step
    return st;
  }

  Status Receive(uint64_t want_id, ChunkRead* read, Deadline d) {
    FrameHeader h;
    RLB_RETURN_IF_ERROR(RecvHeader(sock_, &h, d));
    if (h.type == FrameType::kError) {
      std::string body;
      RLB_RETURN_IF_ERROR(RecvBody(sock_, h, &body, d));
      return DecodeErrorBody(reinterpret_cast<const uint8_t*>(body.data()), body.size());
    }
    if (h.type != FrameType::kChunk || h.request_id != want_id) {
      return Status(Code::kProtocol, "chunk response out of order or of the wrong type");
    }
    read->reply = static_cast<ReplyStatus>(h.status);
    uint64_t want_len = kChunkPrefixBytes + (read->reply == ReplyStatus::kOk ? read->length : 0);
    if (h.length != want_len) {
      return Status(Code::kProtocol, "chunk response of " + std::to_string(h.length) +
                                         " bytes, expected " + std::to_string(want_len));
    }
    uint8_t prefix[kChunkPrefixBytes];
    RLB_RETURN_IF_ERROR(sock_.RecvAll(prefix, sizeof(prefix), d));
    ByteReader r(prefix, sizeof(prefix));
    int64_t version;
    uint32_t index;
    RLB_RETURN_IF_ERROR(r.I64(&version));
    RLB_RETURN_IF_ERROR(r.U32(&index));
    if (version != read->version || index != read->index) {
      return Status(Code::kProtocol, "chunk response names another chunk than was asked for");
    }
    if (read->reply != ReplyStatus::kOk) return Status::Ok();
    // Take whatever has arrived, up to a piece, and hash it while it is in cache: as many
    // wakeups as a plain socket copy, one pass over the bytes after the kernel's.
    Polyval hash(*read->hash_key);
    for (uint64_t done = 0; done < read->length;) {
      if (d.Expired()) return Status(Code::kTimeout, "chunk did not arrive before the request deadline");
      size_t want = static_cast<size_t>(std::min<uint64_t>(kRecvPiece, read->length - done));
      size_t got = 0;
      RLB_RETURN_IF_ERROR(sock_.RecvSome(read->dst + done, want, &got, d));
      hash.Update(read->dst + done, got);
      done += got;
    }
    read->digest = hash.Finish();
    return Status::Ok();
  }

  Socket sock_;
  PeerIdentity peer_;
  bool reused_;
  bool proven_ = false;          // a read completed on this connection since it was taken
  std::atomic<bool> broken_{false};
  ConnectionPool* pool_;
  std::string host_;
  int port_;
  std::deque<uint64_t> pending_;
  uint64_t next_id_ = 0;
};

class TcpTransport : public Transport {
 public:
  const char* name() const override { return "tcp"; }
  TransportCaps caps() const override { return TransportCaps{}; }
  bool Reaches(const PeerIdentity&) const override { return true; }

  Status OpenStream(SourceLink& link, int64_t, const StreamOptions& opts,
                    std::unique_ptr<ChunkStream>* out) override {
    Connection c;
    RLB_RETURN_IF_ERROR(ConnectAuthenticated(opts.pool, link.host(), link.port(), link.secret(),
                                             link.peer().server_id,
                                             Deadline::After(opts.connect_timeout_s), &c, opts.interrupt));
    *out = std::make_unique<TcpChunkStream>(std::move(c), opts.pool, link.host(), link.port());
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport() { return std::make_unique<TcpTransport>(); }

Status SendChunkOverTcp(Socket& s, uint64_t request_id, int64_t version, uint32_t index,
                        ReplyStatus reply, const ChunkLease& lease, Pacer* pacer, Deadline d) {
  std::string prefix = ChunkPrefix(version, index);
  uint32_t len = reply == ReplyStatus::kOk ? lease.length : 0;
  FrameHeader h;
  h.type = FrameType::kChunk;
  h.status = static_cast<uint32_t>(reply);
  h.length = kChunkPrefixBytes + len;
  h.request_id = request_id;
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  struct iovec iov[3] = {{head, kFrameHeaderBytes},
                         {&prefix[0], kChunkPrefixBytes},
                         {const_cast<uint8_t*>(lease.data), len}};
  if (pacer == nullptr) return s.SendV(iov, 3, d);
  // Paced piece by piece, each with the send's deadline, so a receiver that leaves (or a
  // send that cannot finish in time) stops costing tokens after one piece.
  auto gone = [&s] { return s.HungUp(); };
  size_t sent = 0;
  for (int first = 1; sent < len || first; first = 0) {
    size_t piece = std::min<size_t>(len - sent, kPacedPieceBytes);
    size_t head_bytes = first ? kFrameHeaderBytes + kChunkPrefixBytes : 0;
    Status st = pacer->Acquire(head_bytes + piece, d, gone);
    if (first && st.code() == Code::kTimeout) {
      // Nothing of this chunk is on the wire yet: say why, so the puller sees a timeout
      // (and may ask another source) instead of a connection closed mid-frame.
      h.status = static_cast<uint32_t>(ReplyStatus::kBusy);
      h.length = kChunkPrefixBytes;
      EncodeFrameHeader(h, head);
      return s.SendV(iov, 2, d);
    }
    RLB_RETURN_IF_ERROR(st);
    struct iovec out[3] = {iov[0], iov[1], {const_cast<uint8_t*>(lease.data) + sent, piece}};
    RLB_RETURN_IF_ERROR(first ? s.SendV(out, 3, d) : s.SendV(&out[2], 1, d));
    sent += piece;
  }
  return Status::Ok();
}

}  // namespace rlboost
