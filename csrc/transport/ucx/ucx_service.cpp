// UCX server side: a listener and a progress thread started on the first UCX request,
// and one memory registration per lease, packed into an rkey for the puller.
#include <arpa/inet.h>
#include <netdb.h>

#include <atomic>
#include <mutex>
#include <thread>
#include <vector>

#include "common/bytes.h"
#include "transport/tcp/frame_io.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_worker.h"

namespace rlboost {
namespace {

void OnServerEndpointError(void*, ucp_ep_h, ucs_status_t) {}

// Listener, worker and progress thread shared by every connection of one weight server.
class UcxServer {
 public:
  static Status Start(const ServiceOptions& opts, std::shared_ptr<UcxServer>* out) {
    auto s = std::make_shared<UcxServer>();
    RLB_RETURN_IF_ERROR(UcxContext::Create(&s->ctx_));
    RLB_RETURN_IF_ERROR(UcxWorker::Create(s->ctx_, true, &s->worker_));
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(opts.host.c_str(), std::to_string(opts.ucx_port).c_str(), &hints, &res) != 0 || !res) {
      return Status(Code::kIo, "cannot resolve " + opts.host + " for the UCX listener");
    }
    ucp_listener_params_t lp = {};
    lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    lp.sockaddr.addr = res->ai_addr;
    lp.sockaddr.addrlen = res->ai_addrlen;
    lp.conn_handler.cb = &UcxServer::OnConnection;
    lp.conn_handler.arg = s.get();
    ucs_status_t st = ucp_listener_create(s->worker_->get(), &lp, &s->listener_);
    freeaddrinfo(res);
    RLB_RETURN_IF_ERROR(UcxStatus(st, "ucp_listener_create"));
    ucp_listener_attr_t attr = {};
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    RLB_RETURN_IF_ERROR(UcxStatus(ucp_listener_query(s->listener_, &attr), "ucp_listener_query"));
    s->port_ = attr.sockaddr.ss_family == AF_INET6
                   ? ntohs(reinterpret_cast<sockaddr_in6*>(&attr.sockaddr)->sin6_port)
                   : ntohs(reinterpret_cast<sockaddr_in*>(&attr.sockaddr)->sin_port);
    s->thread_ = std::thread([p = s.get()] {
      while (!p->closing_) p->worker_->ProgressOrSleep(100);
    });
    *out = std::move(s);
    return Status::Ok();
  }

  ~UcxServer() {
    closing_ = true;
    if (thread_.joinable()) thread_.join();
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    for (ucp_ep_h ep : eps_) worker_->Wait(ucp_ep_close_nbx(ep, &param), Deadline::After(1.0), nullptr);
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    worker_.reset();
  }

  ucp_context_h context() const { return ctx_->get(); }
  uint16_t port() const { return port_; }

 private:
  static void OnConnection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<UcxServer*>(arg);
    ucp_ep_params_t p = {};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = OnServerEndpointError;
    ucp_ep_h ep = nullptr;
    if (ucp_ep_create(self->worker_->get(), &p, &ep) == UCS_OK) self->eps_.push_back(ep);
  }

  std::shared_ptr<UcxContext> ctx_;
  std::unique_ptr<UcxWorker> worker_;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> closing_{false};
  std::vector<ucp_ep_h> eps_;  // touched only by the progress thread, then the destructor
};

// A region registered for one connection's lease; unregistered when the lease ends.
struct UcxRegistration {
  std::shared_ptr<UcxServer> server;
  RegionLease lease;
  ucp_mem_h memh = nullptr;
  ~UcxRegistration() {
    if (memh != nullptr) ucp_mem_unmap(server->context(), memh);
  }
};

class UcxService : public TransportService {
 public:
  explicit UcxService(const ServiceOptions& opts) : opts_(opts) {}

  bool Handles(FrameType t) const override { return t == FrameType::kUcxOpenRequest; }

  Status Handle(const FrameHeader& h, const std::string& body, ServiceConnection& conn,
                ServingBackend& backend, Deadline d) override {
    int64_t version;
    RLB_RETURN_IF_ERROR(DecodeVersionBody(body, &version));
    auto reg = std::make_shared<UcxRegistration>();
    ReplyStatus st = backend.LeaseRegion(version, &reg->lease);
    std::string reply;
    if (st == ReplyStatus::kOk && !Register(reg.get(), &reply).ok()) st = ReplyStatus::kUnavailable;
    if (st == ReplyStatus::kOk) conn.state.push_back(reg);
    if (st != ReplyStatus::kOk) reply.clear();
    return SendFrame(*conn.socket, FrameType::kUcxOpen, static_cast<uint32_t>(st), h.request_id, reply, d);
  }

 private:
  Status Register(UcxRegistration* reg, std::string* reply) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (server_ == nullptr) RLB_RETURN_IF_ERROR(UcxServer::Start(opts_, &server_));
      reg->server = server_;
    }
    std::string rkey;
    if (reg->lease.size > 0) {
      ucp_mem_map_params_t mp = {};
      mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
      mp.address = reg->lease.data;
      mp.length = reg->lease.size;
      RLB_RETURN_IF_ERROR(UcxStatus(ucp_mem_map(reg->server->context(), &mp, &reg->memh), "ucp_mem_map"));
      void* packed = nullptr;
      size_t packed_len = 0;
      RLB_RETURN_IF_ERROR(UcxStatus(ucp_rkey_pack(reg->server->context(), reg->memh, &packed, &packed_len), "ucp_rkey_pack"));
      rkey.assign(static_cast<const char*>(packed), packed_len);
      ucp_rkey_buffer_release(packed);
    }
    ByteWriter w(reply);
    w.U16(reg->server->port());
    w.U16(0);
    w.U32(static_cast<uint32_t>(rkey.size()));
    w.U64(reinterpret_cast<uint64_t>(reg->lease.data));
    w.U64(reg->lease.size);
    w.Raw(rkey.data(), rkey.size());
    return Status::Ok();
  }

  ServiceOptions opts_;
  std::mutex mu_;
  std::shared_ptr<UcxServer> server_;
};

}  // namespace

std::unique_ptr<TransportService> MakeUcxService(const ServiceOptions& opts) {
  return std::make_unique<UcxService>(opts);
}

}  // namespace rlboost
