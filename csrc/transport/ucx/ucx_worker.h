// Small RAII wrappers over a UCP context and worker, and a blocking wait for a request
// that sleeps on the worker's event fd instead of spinning (this matters on small hosts
// where a spinning waiter steals the core the data path needs).
#pragma once

#include <ucp/api/ucp.h>

#include <memory>
#include <string>

#include "common/deadline.h"
#include "common/status.h"

namespace rlboost {

Status UcxStatus(ucs_status_t s, const std::string& what);

class UcxContext {
 public:
  static Status Create(std::shared_ptr<UcxContext>* out);
  ~UcxContext();
  ucp_context_h get() const { return ctx_; }

 private:
  ucp_context_h ctx_ = nullptr;
};

class UcxWorker {
 public:
  static Status Create(std::shared_ptr<UcxContext> ctx, bool multi_thread, std::unique_ptr<UcxWorker>* out);
  ~UcxWorker();
  ucp_worker_h get() const { return worker_; }
  // Progresses until `request` completes (or the deadline / abort flag); frees it. After
  // the deadline or abort the request is cancelled and waited for at most kCancelGraceS
  // more; kPeerLost then means it could not be cancelled and may still be in flight: the
  // caller must force-close its endpoint before reusing the request's memory.
  Status Wait(ucs_status_ptr_t request, Deadline d, const volatile bool* abort);
  // Progresses once, then sleeps on the event fd for at most timeout_ms.
  void ProgressOrSleep(int timeout_ms);

  static constexpr double kCancelGraceS = 0.5;

 private:
  Status CancelAndWait(ucs_status_ptr_t request, bool timed_out);
  std::shared_ptr<UcxContext> ctx_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
};

}  // namespace rlboost
