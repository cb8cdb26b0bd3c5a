// Status: the error value every native component returns. It crosses into Python only
// at the binding boundary, where StatusError is translated into the exception class of
// rlboost.errors that matches its code (see csrc/bindings/errors.cpp).
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace rlboost {

enum class Code : int {
  kOk = 0,
  kInvalidArgument,  // -> ValueError
  kProtocol,         // malformed, truncated, oversized or wrong-format bytes -> ProtocolError
  kAuth,             // wrong shared secret -> AuthError
  kTimeout,          // a deadline passed -> TransferTimeout
  kPeerLost,         // the other side vanished -> PeerLost
  kChecksum,         // bytes failed their checksum -> ChecksumMismatch
  kIntegrity,        // a chunk does not match its tag (forged or altered) -> IntegrityError
  kUnknownVersion,   // the version asked for is not held -> VersionMismatch
  kClosed,           // the object was closed -> TransferClosed
  kIo,               // other OS-level failure -> TransferError
  kInternal,         // a bug -> TransferError
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

// Thrown only at the binding layer (ThrowIfError) so pybind11 can translate it.
class StatusError : public std::runtime_error {
 public:
  explicit StatusError(Status s) : std::runtime_error(s.message()), status_(std::move(s)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

inline void ThrowIfError(const Status& s) {
  if (!s.ok()) throw StatusError(s);
}

#define RLB_RETURN_IF_ERROR(expr)          \
  do {                                     \
    ::rlboost::Status _rlb_s = (expr);     \
    if (!_rlb_s.ok()) return _rlb_s;       \
  } while (0)

}  // namespace rlboost
