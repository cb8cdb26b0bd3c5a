// The transports built into this module, by name, and what their control requests share.
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#ifdef RLBOOST_HAS_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace rlboost {

Status RequestRegion(SourceLink& link, FrameType request, FrameType response, int64_t version,
                     const char* unavailable, Deadline d, std::string* reply) {
  FrameHeader h;
  RLB_RETURN_IF_ERROR(link.Call(request, EncodeVersionBody(version), response, &h, reply, d));
  auto st = static_cast<ReplyStatus>(h.status);
  if (st == ReplyStatus::kUnknownVersion) {
    return Status(Code::kUnknownVersion, "source does not hold version " + std::to_string(version));
  }
  if (st != ReplyStatus::kOk) return Status(Code::kInvalidArgument, unavailable);
  return Status::Ok();
}

std::vector<std::string> BuiltTransports() {
  std::vector<std::string> names = {"tcp", "shm"};
#ifdef RLBOOST_HAS_UCX
  names.push_back("ucx");
#endif
  return names;
}

std::unique_ptr<Transport> ChooseTransport(const PeerIdentity& source) {
  std::unique_ptr<Transport> best;
  for (const std::string& name : BuiltTransports()) {
    std::unique_ptr<Transport> t;
    // UCX is chosen only when asked for: it needs its own listener and network setup.
    if (name == "ucx" || !MakeTransport(name, &t).ok() || !t->Reaches(source)) continue;
    if (best == nullptr || (t->caps().source_cpu_free && !best->caps().source_cpu_free)) best = std::move(t);
  }
  return best != nullptr ? std::move(best) : MakeTcpTransport();
}

std::unique_ptr<Transport> FallbackTransport(const Transport&) { return MakeTcpTransport(); }

Status MakeTransport(const std::string& name, std::unique_ptr<Transport>* out) {
  if (name == "tcp") {
    *out = MakeTcpTransport();
  } else if (name == "shm") {
    *out = MakeShmTransport();
#ifdef RLBOOST_HAS_UCX
  } else if (name == "ucx") {
    *out = MakeUcxTransport();
#endif
  } else {
    return Status(Code::kInvalidArgument, "transport '" + name + "' is not built into this module");
  }
  return Status::Ok();
}

std::vector<std::unique_ptr<TransportService>> MakeTransportServices(const ServiceOptions& opts) {
  std::vector<std::unique_ptr<TransportService>> services;
  services.push_back(MakeShmService());
  (void)opts;
#ifdef RLBOOST_HAS_UCX
  services.push_back(MakeUcxService(opts));
#endif
  return services;
}

}  // namespace rlboost
