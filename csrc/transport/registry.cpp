// The transports built into this module, by name.
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#ifdef RLBOOST_HAS_UCX
#include "transport/ucx/ucx_transport.h"
#endif

namespace rlboost {

std::vector<std::string> BuiltTransports() {
  std::vector<std::string> names = {"tcp", "shm"};
#ifdef RLBOOST_HAS_UCX
  names.push_back("ucx");
#endif
  return names;
}

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
