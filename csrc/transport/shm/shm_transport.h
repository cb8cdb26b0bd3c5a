// The shared-memory transport for a source on the same host: the control request goes
// over the authenticated TCP connection, the bytes are copied out of the source's
// memfd region by the puller's own threads (one per stream), hashed for their tags in the same
// pass, with no socket copy and no work for the source's CPU.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace rlboost {

std::unique_ptr<Transport> MakeShmTransport();
std::unique_ptr<TransportService> MakeShmService();

}  // namespace rlboost
