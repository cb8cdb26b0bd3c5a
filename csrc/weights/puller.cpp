// Version resolution across sources: two parallel rounds (each source's own answer, then
// the chosen version from the rest), layout agreement, and the most telling error when
// no source can serve.
#include "weights/puller.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>

#include "common/random.h"

namespace rlboost {

struct Puller::Probe {
  std::unique_ptr<SourceSession> session;
  Manifest manifest;
  HeldState held;
  Status status;
};

namespace {

// Which failure best explains "no source could serve": the user's mistake before the
// network's.
int Severity(Code c) {
  switch (c) {
    case Code::kAuth: return 6;
    case Code::kIntegrity: return 6;
    case Code::kProtocol: return 5;
    case Code::kUnknownVersion: return 4;
    case Code::kTimeout: return 3;
    case Code::kPeerLost: return 2;
    default: return 1;
  }
}

template <typename F>
void ForEachParallel(size_t n, F f) {
  if (n == 1) return f(0);  // the common case needs no thread
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) threads.emplace_back(f, i);
  for (auto& t : threads) t.join();
}

}  // namespace

Puller::Puller(PullOptions opts, std::vector<SourceAddress> sources, uint64_t self_server_id)
    : opts_(std::move(opts)), sources_(std::move(sources)), self_server_id_(self_server_id) {}

Status Puller::Resolve(int64_t version, double timeout_s, double source_timeout_s, PullPlan* out) {
  if (sources_.empty()) return Status(Code::kInvalidArgument, "no sources to pull from");
  Deadline d = Deadline::After(timeout_s);
  std::vector<Probe> probes(sources_.size());
  // Round one: connect, authenticate and ask each source for `version` (or its latest).
  ForEachParallel(sources_.size(), [&](size_t i) {
    Probe& p = probes[i];
    Deadline sd = d.Min(Deadline::After(source_timeout_s));
    Deadline cd = sd.Min(Deadline::After(opts_.connect_timeout_s));
    p.status = SourceSession::Open(sources_[i].host, sources_[i].port, opts_.session(), opts_.pool, 0,
                                   nullptr, cd, &p.session);
    if (p.status.ok() && self_server_id_ != 0 && p.session->peer().server_id == self_server_id_) {
      p.status = Status(Code::kInvalidArgument, "this process's own relay");
    }
    if (p.status.ok()) p.status = p.session->FetchManifest(version, &p.manifest, sd);
    Unanswered(p, source_timeout_s);
  });
  int64_t target = version;
  for (auto& p : probes) {
    if (version < 0 && p.status.ok()) target = std::max(target, p.manifest.version);
  }
  // Round two: the chosen version from every source that answered another one, and
  // what each source holds of it.
  if (target >= 0) {
    ForEachParallel(sources_.size(), [&](size_t i) {
      Probe& p = probes[i];
      Deadline sd = d.Min(Deadline::After(source_timeout_s));
      bool retry = p.session && (p.status.code() == Code::kUnknownVersion ||
                                 (p.status.ok() && p.manifest.version != target));
      if (retry) p.status = p.session->FetchManifest(target, &p.manifest, sd);
      if (p.status.ok()) p.status = p.session->FetchHave(target, 0, 0, &p.held, sd);
      if (p.session) Unanswered(p, source_timeout_s);  // round one's silent ones have none
    });
  }
  return AssemblePlan(probes, out);
}

void Puller::Unanswered(Probe& p, double source_timeout_s) {
  if (p.status.code() != Code::kTimeout) return;
  p.session.reset();  // out of step with its source: never reused
  char within[32];
  snprintf(within, sizeof(within), "%.3g", source_timeout_s);
  p.status = Status(Code::kTimeout, std::string("did not answer within ") + within + " s (" + p.status.message() + ")");
}

Status Puller::AssemblePlan(std::vector<Probe>& probes, PullPlan* out) {
  // The manifest most sources agree on (the first listed among as many): one source that
  // answers with another cannot make the others look wrong.
  const Manifest* reference = nullptr;
  size_t agreeing = 0;
  for (auto& p : probes) {
    if (!p.status.ok()) continue;
    size_t n = std::count_if(probes.begin(), probes.end(), [&](const Probe& q) {
      return q.status.ok() && q.manifest.SameLayout(p.manifest);
    });
    if (n > agreeing) {
      reference = &p.manifest;
      agreeing = n;
    }
  }
  Status worst;
  std::vector<PullSource> pending;
  out->sources.clear();
  out->skipped.clear();
  for (size_t i = 0; i < probes.size(); ++i) {
    Probe& p = probes[i];
    if (p.status.ok() && reference != nullptr && !p.manifest.SameLayout(*reference)) {
      p.status = Status(Code::kProtocol, "its manifest differs from the other sources'");
    }
    if (!p.status.ok()) {
      std::string where = sources_[i].host + ":" + std::to_string(sources_[i].port);
      if (p.status.code() != Code::kInvalidArgument &&
          (worst.ok() || Severity(p.status.code()) > Severity(worst.code()))) {
        worst = Status(p.status.code(), where + ": " + p.status.message());
      }
      if (p.status.code() == Code::kUnknownVersion && p.session) {
        // Reachable but without the version yet (a peer may be starting the same pull):
        // watched, and used once it holds chunks with the agreed layout.
        pending.push_back(PullSource{std::move(p.session), HeldState{}, true});
      } else {
        out->skipped.push_back(where + ": " + p.status.message());
      }
      continue;
    }
    out->sources.push_back(PullSource{std::move(p.session), std::move(p.held), false});
  }
  if (out->sources.empty()) {
    if (worst.ok()) worst = Status(Code::kInvalidArgument, "no usable source (only this process's own relay)");
    if (worst.code() != Code::kTimeout) return worst;
    std::string all = "no source answered: ";
    for (size_t i = 0; i < out->skipped.size(); ++i) all += (i ? "; " : "") + out->skipped[i];
    return Status(Code::kTimeout, all);
  }
  out->manifest = *reference;
  for (auto& p : pending) {
    p.held.num_chunks = out->manifest.num_chunks();
    p.held.bitmap.assign((p.held.num_chunks + 7) / 8, 0);
    out->sources.push_back(std::move(p));
  }
  return Status::Ok();
}

Status Puller::Await(int64_t version, double timeout_s, bool* found) {
  if (sources_.empty()) return Status(Code::kInvalidArgument, "no sources to pull from");
  const Deadline d = Deadline::After(timeout_s);
  Interrupt done;
  std::atomic<bool> any{false};
  std::vector<Status> errors(sources_.size());
  ForEachParallel(sources_.size(), [&](size_t i) {
    // Not from the pool: a poll the first answer interrupts cannot be given back.
    std::unique_ptr<SourceSession> s;
    Status st = SourceSession::Open(sources_[i].host, sources_[i].port, opts_.session(), nullptr, 0, &done,
                                    d.Min(Deadline::After(opts_.connect_timeout_s)), &s);
    if (st.ok() && self_server_id_ != 0 && s->peer().server_id == self_server_id_) return;
    while (st.ok() && !any && !d.Expired()) {
      const double left_ms = std::chrono::duration<double, std::milli>(d.at() - Deadline::Clock::now()).count();
      const uint32_t wait_ms = static_cast<uint32_t>(std::clamp<double>(left_ms, 1.0, kMaxHaveWaitMs));
      HeldState held;
      st = s->FetchHave(version, 0, wait_ms, &held, Deadline::After(wait_ms / 1000.0 + opts_.request_timeout_s));
      if (st.ok()) {
        any = true;
        done.Fire();
      } else if (st.code() == Code::kUnknownVersion) {
        st = Status::Ok();  // the wait ran out before the version appeared there
      }
    }
    if (!any) errors[i] = st;
  });
  *found = any;
  if (any) return Status::Ok();
  for (const Status& st : errors) {
    if (st.ok()) return Status::Ok();  // polled until the deadline: the version did not appear
  }
  return errors.front();
}

Status Puller::Start(PullPlan&& plan, uint8_t* dst, RelayTarget relay,
                     const std::vector<uint8_t>& held_seed, std::unique_ptr<PullJob>* out) {
  ClaimOrder order;
  RLB_RETURN_IF_ERROR(SecureRandom(&order.seed, sizeof(order.seed)));
  // Pullers that relay to each other (the sources still pulling, and this one) agree on
  // their ranks without talking: each sorts the same set of relay server ids.
  std::vector<uint64_t> ids = {self_server_id_};
  for (auto& s : plan.sources) {
    if (s.pending || s.held.held_count < s.held.num_chunks) ids.push_back(s.session->peer().server_id);
  }
  std::sort(ids.begin(), ids.end());
  order.pullers = static_cast<uint32_t>(ids.size());
  order.rank = static_cast<uint32_t>(std::find(ids.begin(), ids.end(), self_server_id_) - ids.begin());
  auto job = std::make_unique<PullJob>(opts_, std::move(plan.manifest), std::move(plan.sources), dst,
                                       std::move(relay), held_seed, order);
  RLB_RETURN_IF_ERROR(job->Start());
  *out = std::move(job);
  return Status::Ok();
}

}  // namespace rlboost
