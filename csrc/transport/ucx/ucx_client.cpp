// UCX client side: one worker and endpoint per lane (client-server flow to the source's
// UCX listener), chunks read with ucp_get_nbx straight into the destination.
#include <arpa/inet.h>
#include <netdb.h>

#include <cstring>
#include <deque>
#include <mutex>

#include "common/bytes.h"
#include "common/polyval.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_worker.h"

namespace rlboost {
namespace {

struct UcxRemote {
  std::string host;
  uint16_t port = 0;
  uint64_t base = 0;
  uint64_t size = 0;
  std::string rkey;
};

Status ParseRemote(const std::string& body, UcxRemote* out) {
  ByteReader r(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  uint16_t pad;
  uint32_t rkey_len;
  RLB_RETURN_IF_ERROR(r.U16(&out->port));
  RLB_RETURN_IF_ERROR(r.U16(&pad));
  RLB_RETURN_IF_ERROR(r.U32(&rkey_len));
  RLB_RETURN_IF_ERROR(r.U64(&out->base));
  RLB_RETURN_IF_ERROR(r.U64(&out->size));
  if (rkey_len != r.remaining()) return Status(Code::kProtocol, "ucx-open reply has a bad rkey length");
  out->rkey.assign(body.data() + body.size() - rkey_len, rkey_len);
  return Status::Ok();
}

void OnEndpointError(void* arg, ucp_ep_h, ucs_status_t) { *static_cast<volatile bool*>(arg) = true; }

class UcxChunkStream : public ChunkStream {
 public:
  static Status Open(std::shared_ptr<UcxContext> ctx, const UcxRemote& remote, Deadline deadline,
                     std::unique_ptr<ChunkStream>* out) {
    std::unique_ptr<UcxChunkStream> s(new UcxChunkStream());
    s->remote_ = remote;
    RLB_RETURN_IF_ERROR(UcxWorker::Create(std::move(ctx), false, &s->worker_));
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(remote.host.c_str(), std::to_string(remote.port).c_str(), &hints, &res) != 0 || !res) {
      return Status(Code::kPeerLost, "cannot resolve " + remote.host);
    }
    ucp_ep_params_t p = {};
    p.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                   UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    p.sockaddr.addr = res->ai_addr;
    p.sockaddr.addrlen = res->ai_addrlen;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = OnEndpointError;
    p.err_handler.arg = const_cast<bool*>(&s->failed_);
    ucs_status_t st = ucp_ep_create(s->worker_->get(), &p, &s->ep_);
    freeaddrinfo(res);
    RLB_RETURN_IF_ERROR(UcxStatus(st, "ucp_ep_create"));
    // An rkey is unpacked against the endpoint's final configuration, so the
    // client-server wireup must finish first; a flush completes once it has.
    ucp_request_param_t flush = {};
    RLB_RETURN_IF_ERROR(s->worker_->Wait(ucp_ep_flush_nbx(s->ep_, &flush), deadline, nullptr));
    if (s->failed_) return Status(Code::kPeerLost, "ucx endpoint to " + remote.host + " failed to connect");
    if (!remote.rkey.empty()) {
      RLB_RETURN_IF_ERROR(UcxStatus(ucp_ep_rkey_unpack(s->ep_, remote.rkey.data(), &s->rkey_), "ucp_ep_rkey_unpack"));
    }
    *out = std::move(s);
    return Status::Ok();
  }

  ~UcxChunkStream() override {
    aborted_ = true;
    for (auto& p : pending_) {
      // Once one read could not be cancelled, force-closing the endpoint completes the
      // rest, so none of them can write into the destination after this returns.
      if (worker_->Wait(p.second, Deadline::After(1.0), &aborted_).code() == Code::kPeerLost) ForceClose();
    }
    pending_.clear();
    ForceClose();
  }

  Status Submit(const ChunkRead& read, Deadline) override {
    if (ep_ == nullptr || failed_) return Status(Code::kPeerLost, "ucx endpoint to " + remote_.host + " failed");
    if (read.offset + read.length > remote_.size) return Status(Code::kProtocol, "chunk lies outside the remote region");
    ucs_status_ptr_t req = nullptr;
    if (read.length > 0) {
      ucp_request_param_t param = {};
      req = ucp_get_nbx(ep_, read.dst, read.length, remote_.base + read.offset, rkey_, &param);
      if (UCS_PTR_IS_ERR(req)) return UcxStatus(UCS_PTR_STATUS(req), "ucp_get_nbx");
    }
    pending_.emplace_back(read, req);
    return Status::Ok();
  }

  Status Complete(ChunkRead* read, Deadline d) override {
    if (pending_.empty()) return Status(Code::kInternal, "complete without a submitted read");
    ucs_status_ptr_t req = pending_.front().second;
    pending_.pop_front();
    Status st = worker_->Wait(req, d, &aborted_);
    if (st.code() == Code::kPeerLost) {
      failed_ = true;
      ForceClose();  // completes the reads still in flight before anyone reuses their memory
    }
    RLB_RETURN_IF_ERROR(st);
    if (failed_) return Status(Code::kPeerLost, "ucx endpoint to " + remote_.host + " failed");
    read->digest = PolyvalOf(*read->hash_key, read->dst, read->length);
    read->reply = ReplyStatus::kOk;
    return Status::Ok();
  }

  void Abort() override { aborted_ = true; }

 private:
  UcxChunkStream() = default;

  // Closes the endpoint without the peer's cooperation (bounded: a frozen peer cannot
  // hold it); every request still on it completes with an error.
  void ForceClose() {
    if (rkey_ != nullptr) ucp_rkey_destroy(rkey_);  // UCX: rkeys go before their endpoint
    rkey_ = nullptr;
    if (ep_ == nullptr) return;
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    worker_->Wait(ucp_ep_close_nbx(ep_, &param), Deadline::After(1.0), nullptr);
    ep_ = nullptr;
  }

  UcxRemote remote_;
  std::unique_ptr<UcxWorker> worker_;
  ucp_ep_h ep_ = nullptr;
  ucp_rkey_h rkey_ = nullptr;
  volatile bool failed_ = false;
  volatile bool aborted_ = false;
  std::deque<std::pair<ChunkRead, ucs_status_ptr_t>> pending_;
};

class UcxTransport : public Transport {
 public:
  const char* name() const override { return "ucx"; }
  TransportCaps caps() const override {
    TransportCaps c;
    c.source_cpu_free = true;
    c.leases_until_disconnect = true;  // the source's memory registration ends with the connection
    return c;
  }
  bool Reaches(const PeerIdentity&) const override { return true; }

  Status OpenStream(SourceLink& link, int64_t version, const StreamOptions& opts,
                    std::unique_ptr<ChunkStream>* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx_ == nullptr) {
      std::string reply;
      RLB_RETURN_IF_ERROR(RequestRegion(link, FrameType::kUcxOpenRequest, FrameType::kUcxOpen, version,
                                        "source does not serve over UCX (not built with UCX, or its "
                                        "egress is capped)",
                                        Deadline::After(opts.connect_timeout_s), &reply));
      RLB_RETURN_IF_ERROR(ParseRemote(reply, &remote_));
      if (remote_.size < opts.region_bytes) return Status(Code::kProtocol, "remote region is too small");
      remote_.host = link.host();
      RLB_RETURN_IF_ERROR(UcxContext::Create(&ctx_));
    }
    return UcxChunkStream::Open(ctx_, remote_, Deadline::After(opts.connect_timeout_s), out);
  }

 private:
  std::mutex mu_;
  std::shared_ptr<UcxContext> ctx_;
  UcxRemote remote_;
};

}  // namespace

std::unique_ptr<Transport> MakeUcxTransport() { return std::make_unique<UcxTransport>(); }

}  // namespace rlboost
