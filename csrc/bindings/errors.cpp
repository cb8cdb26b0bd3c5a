// Maps native StatusError codes onto the exception classes defined in rlboost/errors.py,
// so Python callers catch typed errors and never compare integer codes.
#include <pybind11/pybind11.h>

#include "bindings/bind.h"
#include "common/status.h"

namespace py = pybind11;

namespace rlboost {
namespace {

const char* ClassNameFor(Code code) {
  switch (code) {
    case Code::kProtocol: return "ProtocolError";
    case Code::kAuth: return "AuthError";
    case Code::kTimeout: return "TransferTimeout";
    case Code::kPeerLost: return "PeerLost";
    case Code::kChecksum: return "ChecksumMismatch";
    case Code::kIntegrity: return "IntegrityError";
    case Code::kUnknownVersion: return "VersionMismatch";
    case Code::kClosed: return "TransferClosed";
    default: return "TransferError";
  }
}

}  // namespace

void BindErrors(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      if (e.status().code() == Code::kInvalidArgument) {
        const std::string& msg = e.status().message();
        py::object text = py::reinterpret_steal<py::object>(
            PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace"));
        PyErr_SetObject(PyExc_ValueError, text.ptr());
        return;
      }
      py::object errors = py::module_::import("rlboost.errors");
      py::object cls = errors.attr(ClassNameFor(e.status().code()));
      // Messages may quote what a peer or a file said: decoded so that no byte can turn
      // the typed error into a UnicodeDecodeError.
      const std::string& msg = e.status().message();
      py::object text = py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(msg.data(), static_cast<Py_ssize_t>(msg.size()), "backslashreplace"));
      PyErr_SetObject(cls.ptr(), text.ptr());
    }
  });
  m.attr("STATUS_CODES") = py::dict(
      py::arg("ok") = static_cast<int>(Code::kOk),
      py::arg("protocol") = static_cast<int>(Code::kProtocol),
      py::arg("auth") = static_cast<int>(Code::kAuth),
      py::arg("timeout") = static_cast<int>(Code::kTimeout),
      py::arg("peer_lost") = static_cast<int>(Code::kPeerLost),
      py::arg("checksum") = static_cast<int>(Code::kChecksum),
      py::arg("integrity") = static_cast<int>(Code::kIntegrity),
      py::arg("unknown_version") = static_cast<int>(Code::kUnknownVersion));
}

}  // namespace rlboost
