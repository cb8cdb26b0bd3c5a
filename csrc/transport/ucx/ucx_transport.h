// The UCX transport (built when UCX is found): the puller reads chunks with one-sided
// RMA gets straight into the destination, over whatever UCX picks (RDMA across hosts,
// cma/shared memory on one host, TCP otherwise). The rkey and the UCX listener's port are
// handed out only on the authenticated TCP control connection, and the region stays
// pinned (and registered) while that connection holds its lease.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/transport.h"

namespace rlboost {

std::unique_ptr<Transport> MakeUcxTransport();
std::unique_ptr<TransportService> MakeUcxService(const ServiceOptions& opts);

// Process-wide counters of UCX serving: endpoints open now (over all servers), and
// connection requests refused (unknown address, or the endpoint cap reached).
struct UcxServiceStats {
  uint64_t endpoints = 0;
  uint64_t rejected = 0;
};
UcxServiceStats GetUcxServiceStats();

}  // namespace rlboost
