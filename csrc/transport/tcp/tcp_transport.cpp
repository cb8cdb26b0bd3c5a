// TCP chunk streams (client) and chunk sending (server).
#include "transport/tcp/tcp_transport.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <vector>

#include "common/bytes.h"
#include "common/polyval.h"
#include "channel/frame_io.h"
#include "channel/frame_seal.h"

namespace rlboost {
namespace {

// Received bytes are taken as they arrive, up to a piece this large, and decrypted and
// hashed while they are still in L2. (Waiting for whole 256 KiB pieces with MSG_WAITALL
// cost a 1 MiB pull on a kept connection about 1 ms more here.)
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
    FrameCipher* cipher = sock_.seal() != nullptr ? &sock_.seal()->recv() : nullptr;
    uint8_t prefix[kChunkPrefixBytes];
    RLB_RETURN_IF_ERROR(sock_.RecvAll(prefix, sizeof(prefix), d));
    if (cipher != nullptr) RLB_RETURN_IF_ERROR(cipher->Cover(prefix, prefix, sizeof(prefix)));
    ByteReader r(prefix, sizeof(prefix));
    int64_t version = 0;
    uint32_t index = 0;
    RLB_RETURN_IF_ERROR(r.I64(&version));
    RLB_RETURN_IF_ERROR(r.U32(&index));
    if (version != read->version || index != read->index) {
      return Status(Code::kProtocol, "chunk response names another chunk than was asked for");
    }
    if (read->reply == ReplyStatus::kOk) RLB_RETURN_IF_ERROR(ReceiveBytes(read, cipher, d));
    // The reply's status and prefix count only once the frame's tag says they are the source's.
    return RecvTag(sock_, h, d);
  }

  // Takes whatever has arrived, up to a piece, and (with a sealed connection) decrypts it
  // and hashes it for the chunk's tag while it is still in cache: one pass over the bytes
  // after the kernel's copy, not a second one over the whole chunk.
  Status ReceiveBytes(ChunkRead* read, FrameCipher* cipher, Deadline d) {
    Polyval hash(*read->hash_key);
    for (uint64_t done = 0; done < read->length;) {
      if (d.Expired()) return Status(Code::kTimeout, "chunk did not arrive before the request deadline");
      size_t want = static_cast<size_t>(std::min<uint64_t>(kRecvPiece, read->length - done));
      size_t got = 0;
      uint8_t* p = read->dst + done;
      RLB_RETURN_IF_ERROR(sock_.RecvSome(p, want, &got, d));
      if (cipher != nullptr) RLB_RETURN_IF_ERROR(cipher->Carry(p, p, got));
      hash.Update(p, got);
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
                                             link.encrypt(), link.peer().server_id,
                                             Deadline::After(opts.connect_timeout_s), &c, opts.interrupt));
    *out = std::make_unique<TcpChunkStream>(std::move(c), opts.pool, link.host(), link.port());
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Transport> MakeTcpTransport() { return std::make_unique<TcpTransport>(); }

namespace {

// Sealed chunks are encrypted a piece at a time into this buffer, then sent from it while
// the piece is still in cache.
constexpr size_t kSealPieceBytes = 256u << 10;

// Sends a chunk frame whose header is already encoded: prefix and bytes, then (sealed
// connections) the tag; pacing piece by piece when a pacer is given (the first piece's
// tokens were already granted with the header).
Status SendChunkBody(Socket& s, uint8_t* head, std::string& prefix, const uint8_t* data, size_t len,
                     Pacer* pacer, Deadline d) {
  FrameSeal* seal = s.seal();
  FrameCipher* c = seal != nullptr ? &seal->send() : nullptr;
  if (c != nullptr) {
    RLB_RETURN_IF_ERROR(seal->CheckOwner());
    RLB_RETURN_IF_ERROR(c->Begin(head));
    auto* p = reinterpret_cast<uint8_t*>(&prefix[0]);
    RLB_RETURN_IF_ERROR(c->Cover(p, p, kChunkPrefixBytes));
  }
  const bool encrypts = c != nullptr && c->encrypts();
  const size_t piece_bytes = std::max<size_t>(1, encrypts ? kSealPieceBytes : (pacer != nullptr ? kPacedPieceBytes : len));
  thread_local std::vector<uint8_t> scratch;
  if (encrypts && scratch.size() < kSealPieceBytes) scratch.resize(kSealPieceBytes);
  auto gone = [&s] { return s.HungUp(); };
  uint8_t tag[kFrameTagBytes];
  size_t sent = 0;
  for (bool first = true; first || sent < len; first = false) {
    const size_t piece = std::min(len - sent, piece_bytes);
    if (!first && pacer != nullptr) RLB_RETURN_IF_ERROR(pacer->Acquire(piece, d, gone));
    const uint8_t* out = data + sent;
    if (encrypts && piece > 0) {
      RLB_RETURN_IF_ERROR(c->Carry(data + sent, scratch.data(), piece));
      out = scratch.data();
    }
    // The tag goes out with the last piece (one sendmsg for a whole unpaced MACed chunk).
    const bool last = sent + piece == len;
    if (last && c != nullptr) RLB_RETURN_IF_ERROR(c->Tag(tag));
    struct iovec iov[4] = {{head, kFrameHeaderBytes}, {&prefix[0], kChunkPrefixBytes},
                           {const_cast<uint8_t*>(out), piece}, {tag, kFrameTagBytes}};
    const int count = last && c != nullptr ? 4 : 3;
    RLB_RETURN_IF_ERROR(first ? s.SendV(iov, count, d) : s.SendV(&iov[2], count - 2, d));
    sent += piece;
  }
  return Status::Ok();
}

}  // namespace

Status SendChunkOverTcp(Socket& s, uint64_t request_id, int64_t version, uint32_t index,
                        ReplyStatus reply, const ChunkLease& lease, Pacer* pacer, Deadline d) {
  std::string prefix = ChunkPrefix(version, index);
  uint32_t len = reply == ReplyStatus::kOk ? lease.length : 0;
  FrameHeader h;
  h.type = FrameType::kChunk;
  h.status = static_cast<uint32_t>(reply);
  h.length = kChunkPrefixBytes + len;
  h.request_id = request_id;
  if (pacer != nullptr) {
    // Paced piece by piece, each with the send's deadline, so a receiver that leaves (or a
    // send that cannot finish in time) stops costing tokens after one piece.
    size_t first = std::min<size_t>(len, kPacedPieceBytes);
    Status st = pacer->Acquire(kFrameHeaderBytes + kChunkPrefixBytes + first, d, [&s] { return s.HungUp(); });
    if (st.code() == Code::kTimeout) {
      // Nothing of this chunk is on the wire yet: say why, so the puller sees a timeout
      // (and may ask another source) instead of a connection closed mid-frame.
      h.status = static_cast<uint32_t>(ReplyStatus::kBusy);
      h.length = kChunkPrefixBytes;
      len = 0;
    } else {
      RLB_RETURN_IF_ERROR(st);
    }
  }
  uint8_t head[kFrameHeaderBytes];
  EncodeFrameHeader(h, head);
  return SendChunkBody(s, head, prefix, lease.data, len, pacer, d);
}

}  // namespace rlboost
