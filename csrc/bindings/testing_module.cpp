// rlboost._C_testing: hooks that only tests call, kept out of rlboost._C so that nothing a
// run imports can corrupt a served version or fake an error. Linked against the same
// native core; its functions take the objects rlboost._C made.
#include <pybind11/pybind11.h>

#include <string>

#include "common/frame.h"
#include "common/status.h"
#include "weights/version_store.h"

namespace py = pybind11;

namespace rlboost {
namespace {

py::tuple ParseFrame(py::bytes data) {
  std::string s = data;
  if (s.size() < kFrameHeaderBytes) throw StatusError(Status(Code::kProtocol, "truncated frame header"));
  FrameHeader h;
  ThrowIfError(DecodeFrameHeader(reinterpret_cast<const uint8_t*>(s.data()), &h));
  if (s.size() - kFrameHeaderBytes != h.length) throw StatusError(Status(Code::kProtocol, "frame length mismatch"));
  const auto* body = reinterpret_cast<const uint8_t*>(s.data()) + kFrameHeaderBytes;
  if (h.type == FrameType::kError) ThrowIfError(DecodeErrorBody(body, h.length));
  return py::make_tuple(static_cast<int>(h.type), h.status, h.request_id,
                        py::bytes(reinterpret_cast<const char*>(body), h.length));
}

}  // namespace
}  // namespace rlboost

PYBIND11_MODULE(_C_testing, m) {
  using namespace rlboost;
  m.doc() = "Test hooks of rlboost's native core (never imported by a run)";
  // The exception translation is rlboost._C's: importing it registers it.
  py::module_::import("rlboost._C");
  m.def("parse_frame", &ParseFrame, py::arg("frame"),
        "Decodes one whole frame; an error frame raises its typed error.");
  m.def("raise_status", [](int code, const std::string& msg) {
        if (code <= static_cast<int>(Code::kOk) || code > static_cast<int>(Code::kInternal)) {
          throw StatusError(Status(Code::kInvalidArgument, "no status code " + std::to_string(code)));
        }
        throw StatusError(Status(static_cast<Code>(code), msg));
      }, py::arg("code"), py::arg("message"), "Raises the typed error of a native status code.");
  m.def("corrupt_byte", [](VersionStore& store, int64_t version, uint64_t offset) {
        ThrowIfError(store.CorruptByteForTests(version, offset));
      }, py::arg("store"), py::arg("version"), py::arg("offset"),
      "Flips one byte of a served version in place.");
}
