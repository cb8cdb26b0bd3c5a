// The TCP transport: chunk requests pipelined on dedicated connections, responses
// received straight into the destination, hashed piece by piece while hot in cache.
#pragma once

#include <memory>

#include "transport/transport.h"

namespace rlboost {

std::unique_ptr<Transport> MakeTcpTransport();

// Server side of a chunk request: sends header, prefix and the leased bytes straight
// from the region (no copy), after the pacer (if any) grants the whole chunk.
Status SendChunkOverTcp(Socket& s, uint64_t request_id, int64_t version, uint32_t index,
                        ReplyStatus reply, const ChunkLease& lease, Pacer* pacer, Deadline d);

}  // namespace rlboost
