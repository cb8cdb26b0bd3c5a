// UCX server side: a listener and a progress thread started on the first UCX request,
// and one memory registration per lease, packed into an rkey for the puller. Endpoints
// are admitted only from addresses holding a registration, bounded, and closed when
// their peer goes; registrations per control connection are bounded.
#include <arpa/inet.h>
#include <netdb.h>

#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/bytes.h"
#include "channel/frame_io.h"
#include "transport/ucx/ucx_transport.h"
#include "transport/ucx/ucx_worker.h"

namespace rlboost {
namespace {

// Endpoints a server keeps at once, and UCX registrations one control connection may
// hold (a puller needs one per version it pulls on that connection).
constexpr size_t kMaxEndpoints = 256;
constexpr size_t kMaxRegistrationsPerConnection = 4;

std::atomic<uint64_t> g_endpoints{0};
std::atomic<uint64_t> g_rejected{0};

// The peer's IP address (without the port), or "" when it cannot be read.
std::string AddressText(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(a).sin_addr, buf, sizeof(buf));
  } else if (a.ss_family == AF_INET6) {
    const auto& in6 = reinterpret_cast<const sockaddr_in6&>(a).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&in6)) {
      inet_ntop(AF_INET, &in6.s6_addr[12], buf, sizeof(buf));  // same peer as its IPv4 form
    } else {
      inet_ntop(AF_INET6, &in6, buf, sizeof(buf));
    }
  }
  return buf;
}

std::string SocketPeer(int fd) {
  sockaddr_storage a = {};
  socklen_t len = sizeof(a);
  return getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 ? AddressText(a) : "";
}

// Listener, worker and progress thread shared by every connection of one weight server.
// The UCX listener cannot authenticate, so it accepts endpoints only from addresses that
// hold a registration granted on an authenticated control connection (the rkey is secret
// too; this keeps strangers from holding endpoints), at most kMaxEndpoints at once.
// Endpoints are closed as soon as their peer fails or disconnects.
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
      while (!p->closing_) {
        p->worker_->ProgressOrSleep(100);
        p->CloseFailedEndpoints();
      }
    });
    *out = std::move(s);
    return Status::Ok();
  }

  ~UcxServer() {
    closing_ = true;
    if (thread_.joinable()) thread_.join();
    failed_.insert(failed_.end(), eps_.begin(), eps_.end());
    CloseFailedEndpoints();
    for (ucs_status_ptr_t r : closing_reqs_) worker_->Wait(r, Deadline::After(1.0), nullptr);
    if (listener_ != nullptr) ucp_listener_destroy(listener_);
    worker_.reset();
  }

  ucp_context_h context() const { return ctx_->get(); }
  uint16_t port() const { return port_; }

  // Registrations granted to `peer` on authenticated connections (endpoints from it are
  // accepted while it holds at least one).
  void Admit(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    ++admitted_[peer];
  }
  void Unadmit(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = admitted_.find(peer);
    if (it != admitted_.end() && --it->second == 0) admitted_.erase(it);
  }

 private:
  bool Admitted(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    return !peer.empty() && admitted_.count(peer) > 0;
  }

  static void OnConnection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<UcxServer*>(arg);
    ucp_conn_request_attr_t attr = {};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    bool known = ucp_conn_request_query(request, &attr) == UCS_OK && self->Admitted(AddressText(attr.client_address));
    if (!known || self->eps_.size() >= kMaxEndpoints) {
      ucp_listener_reject(self->listener_, request);
      ++g_rejected;
      return;
    }
    ucp_ep_params_t p = {};
    p.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                   UCP_EP_PARAM_FIELD_ERR_HANDLER;
    p.conn_request = request;
    p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    p.err_handler.cb = &UcxServer::OnEndpointError;
    p.err_handler.arg = self;
    ucp_ep_h ep = nullptr;
    if (ucp_ep_create(self->worker_->get(), &p, &ep) == UCS_OK) {
      self->eps_.insert(ep);
      ++g_endpoints;
    }
  }

  // A peer that disconnects (or fails) shows up here; the endpoint is closed after the
  // callback returns, since UCX callbacks must not progress the worker.
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t) {
    static_cast<UcxServer*>(arg)->failed_.push_back(ep);
  }

  void CloseFailedEndpoints() {
    ucp_request_param_t param = {};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    std::vector<ucp_ep_h> failed;
    failed.swap(failed_);  // closing may report more failures
    for (ucp_ep_h ep : failed) {
      if (eps_.erase(ep) == 0) continue;
      --g_endpoints;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &param);
      if (UCS_PTR_IS_PTR(r)) closing_reqs_.push_back(r);
    }
    closing_reqs_.erase(std::remove_if(closing_reqs_.begin(), closing_reqs_.end(), [](ucs_status_ptr_t r) {
                          if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
                          ucp_request_free(r);
                          return true;
                        }), closing_reqs_.end());
  }

  std::shared_ptr<UcxContext> ctx_;
  std::unique_ptr<UcxWorker> worker_;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<bool> closing_{false};
  std::mutex mu_;
  std::map<std::string, int> admitted_;  // guarded by mu_
  // Touched only by the progress thread (in UCX callbacks), then the destructor.
  std::unordered_set<ucp_ep_h> eps_;
  std::vector<ucp_ep_h> failed_;
  std::vector<ucs_status_ptr_t> closing_reqs_;
};

// A region registered for one connection's lease; unregistered when the lease ends.
struct UcxRegistration {
  std::shared_ptr<UcxServer> server;
  std::string peer;
  RegionLease lease;
  ucp_mem_h memh = nullptr;
  ~UcxRegistration() {
    if (memh != nullptr) ucp_mem_unmap(server->context(), memh);
    if (server != nullptr && !peer.empty()) server->Unadmit(peer);
  }
};

// Registrations are made with this deleter type, so a connection's generic state list can
// be searched for them (std::get_deleter) without a UCX-specific field.
struct UcxRegistrationDeleter {
  void operator()(UcxRegistration* r) const { delete r; }
};

size_t CountRegistrations(const ServiceConnection& conn) {
  return std::count_if(conn.state.begin(), conn.state.end(), [](const std::shared_ptr<void>& p) {
    return std::get_deleter<UcxRegistrationDeleter>(p) != nullptr;
  });
}

}  // namespace

UcxServiceStats GetUcxServiceStats() { return UcxServiceStats{g_endpoints.load(), g_rejected.load()}; }

namespace {

class UcxService : public TransportService {
 public:
  explicit UcxService(const ServiceOptions& opts) : opts_(opts) {}

  bool Handles(FrameType t) const override { return t == FrameType::kUcxOpenRequest; }

  Status Handle(const FrameHeader& h, const std::string& body, ServiceConnection& conn,
                ServingBackend& backend, Deadline d) override {
    int64_t version;
    RLB_RETURN_IF_ERROR(DecodeVersionBody(body, &version));
    if (CountRegistrations(conn) >= kMaxRegistrationsPerConnection) {
      return Status(Code::kProtocol, "too many UCX registrations on one connection");
    }
    std::shared_ptr<UcxRegistration> reg(new UcxRegistration(), UcxRegistrationDeleter());
    reg->peer = SocketPeer(conn.socket->fd());
    ReplyStatus st = backend.LeaseRegion(version, conn.revoke, &reg->lease);
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
    // Admitted before the reply goes out, so the puller's endpoint is expected.
    if (!reg->peer.empty()) reg->server->Admit(reg->peer);
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
