// UCP context/worker lifetimes and event-driven request waits.
#include "transport/ucx/ucx_worker.h"

#include <poll.h>

#include <algorithm>

namespace rlboost {

Status UcxStatus(ucs_status_t s, const std::string& what) {
  if (s == UCS_OK) return Status::Ok();
  std::string msg = what + ": " + ucs_status_string(s);
  switch (s) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
      return Status(Code::kPeerLost, msg);
    case UCS_ERR_TIMED_OUT:
      return Status(Code::kTimeout, msg);
    default:
      return Status(Code::kIo, msg);
  }
}

Status UcxContext::Create(std::shared_ptr<UcxContext>* out) {
  ucp_config_t* config = nullptr;
  RLB_RETURN_IF_ERROR(UcxStatus(ucp_config_read(nullptr, nullptr, &config), "ucp_config_read"));
  ucp_params_t params = {};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  auto ctx = std::make_shared<UcxContext>();
  ucs_status_t s = ucp_init(&params, config, &ctx->ctx_);
  ucp_config_release(config);
  RLB_RETURN_IF_ERROR(UcxStatus(s, "ucp_init"));
  *out = std::move(ctx);
  return Status::Ok();
}

UcxContext::~UcxContext() {
  if (ctx_ != nullptr) ucp_cleanup(ctx_);
}

Status UcxWorker::Create(std::shared_ptr<UcxContext> ctx, bool multi_thread, std::unique_ptr<UcxWorker>* out) {
  std::unique_ptr<UcxWorker> w(new UcxWorker());
  w->ctx_ = std::move(ctx);
  ucp_worker_params_t params = {};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = multi_thread ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE;
  RLB_RETURN_IF_ERROR(UcxStatus(ucp_worker_create(w->ctx_->get(), &params, &w->worker_), "ucp_worker_create"));
  RLB_RETURN_IF_ERROR(UcxStatus(ucp_worker_get_efd(w->worker_, &w->efd_), "ucp_worker_get_efd"));
  *out = std::move(w);
  return Status::Ok();
}

UcxWorker::~UcxWorker() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
}

void UcxWorker::ProgressOrSleep(int timeout_ms) {
  if (ucp_worker_progress(worker_) != 0) return;
  if (ucp_worker_arm(worker_) != UCS_OK) return;  // busy: events are pending
  struct pollfd pfd = {efd_, POLLIN, 0};
  poll(&pfd, 1, timeout_ms);
}

Status UcxWorker::Wait(ucs_status_ptr_t request, Deadline d, const volatile bool* abort) {
  if (request == nullptr) return Status::Ok();
  if (UCS_PTR_IS_ERR(request)) return UcxStatus(UCS_PTR_STATUS(request), "ucx request");
  ucs_status_t s;
  while ((s = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    if (d.Expired() || (abort != nullptr && *abort)) return CancelAndWait(request, d.Expired());
    int ms = d.never() ? 100 : static_cast<int>(std::min(100.0, d.RemainingSeconds() * 1000.0)) + 1;
    ProgressOrSleep(ms);
  }
  ucp_request_free(request);
  return UcxStatus(s, "ucx request");
}

Status UcxWorker::CancelAndWait(ucs_status_ptr_t request, bool timed_out) {
  // Not every operation can be cancelled (an RMA get over TCP cannot), so the wait after
  // the cancel is bounded too; past it the request is handed back to UCX unfinished and
  // the caller must force-close the endpoint before its destination memory is reused.
  ucp_request_cancel(worker_, request);
  Deadline grace = Deadline::After(kCancelGraceS);
  while (ucp_request_check_status(request) == UCS_INPROGRESS) {
    if (grace.Expired()) {
      ucp_request_free(request);
      return Status(Code::kPeerLost, "ucx request could not be cancelled; the peer stopped responding");
    }
    ProgressOrSleep(10);
  }
  ucp_request_free(request);
  return Status(timed_out ? Code::kTimeout : Code::kClosed, "ucx request did not complete");
}

}  // namespace rlboost
