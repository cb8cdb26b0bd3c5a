// Puller: the receiving side's entry point. It connects out to every source it is given
// (trainer and peers), agrees on one version and its manifest, learns what each source
// holds, and hands that plan to a PullJob that moves the bytes.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "weights/pull_job.h"

namespace rlboost {

struct SourceAddress {
  std::string host;
  int port = 0;
};

// A version resolved against the sources: its manifest and the sources that hold it.
struct PullPlan {
  Manifest manifest;
  std::vector<PullSource> sources;
  std::vector<std::string> skipped;  // "host:port: reason" for sources left out
};

class Puller {
 public:
  // self_server_id: this process's own relay server, never used as a source (0: none).
  Puller(PullOptions opts, std::vector<SourceAddress> sources, uint64_t self_server_id);

  // version -1 asks for the newest version any source holds complete. Each source must
  // answer each round within source_timeout_s (and all within timeout_s): one that does
  // not (a frozen process, a socket nobody reads) is skipped, so it cannot hold up the
  // others; only when none answers does this fail.
  Status Resolve(int64_t version, double timeout_s, double source_timeout_s, PullPlan* out);
  // Waits, at most timeout_s, until any source holds some of `version` (a version its
  // publisher is still computing, such as a delta); *found says whether one does. Each
  // source is long-polled on a connection of its own, and the first that has the version
  // ends the others' polls. Unreachable sources are skipped; only when every source fails
  // is that an error.
  Status Await(int64_t version, double timeout_s, bool* found);
  // Starts moving bytes into dst (at least manifest.total_bytes long).
  Status Start(PullPlan&& plan, uint8_t* dst, RelayTarget relay, const std::vector<uint8_t>& held_seed,
               std::unique_ptr<PullJob>* out);

  const PullOptions& options() const { return opts_; }

 private:
  struct Probe;
  Status AssemblePlan(std::vector<Probe>& probes, PullPlan* out);
  static void Unanswered(Probe& p, double source_timeout_s);
  PullOptions opts_;
  std::vector<SourceAddress> sources_;
  uint64_t self_server_id_;
};

}  // namespace rlboost
