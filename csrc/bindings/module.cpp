// rlboost._C: bytes and addresses only. Never includes torch headers, so importing it
// never imports torch.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "rlboost native core: transports, weight server and puller, request-state codec, KV page gather/scatter";
#ifdef RLBOOST_HAS_UCX
  m.attr("HAS_UCX") = true;
#else
  m.attr("HAS_UCX") = false;
#endif
#ifdef RLBOOST_HAS_AEAD
  m.attr("HAS_AEAD") = true;
#else
  m.attr("HAS_AEAD") = false;
#endif
#ifdef RLBOOST_HAS_CUDA
  m.attr("HAS_CUDA") = true;
#else
  m.attr("HAS_CUDA") = false;
#endif
  rlboost::BindErrors(m);
  rlboost::BindTransfer(m);
  rlboost::BindChecksums(m);
  rlboost::BindMigration(m);
  rlboost::BindDelta(m);
}
