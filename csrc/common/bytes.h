// Little-endian writer and bounds-checked reader for wire bodies. Every read checks the
// remaining length first, so a short or lying body becomes a protocol error, not a
// read past the end.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire format is little-endian");

namespace rlboost {

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  void U8(uint8_t v) { Raw(&v, 1); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void I64(int64_t v) { Raw(&v, 8); }
  void Raw(const void* p, size_t n) { out_->append(static_cast<const char*>(p), n); }

 private:
  std::string* out_;
};

class ByteReader {
 public:
  ByteReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  Status U8(uint8_t* v) { return Raw(v, 1); }
  Status U16(uint16_t* v) { return Raw(v, 2); }
  Status U32(uint32_t* v) { return Raw(v, 4); }
  Status U64(uint64_t* v) { return Raw(v, 8); }
  Status I64(int64_t* v) { return Raw(v, 8); }
  Status Raw(void* out, size_t n) {
    if (n > n_ - pos_) return Status(Code::kProtocol, "frame body is shorter than its fields");
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
    return Status::Ok();
  }
  // A view of the next n bytes without copying.
  Status View(const uint8_t** out, size_t n) {
    if (n > n_ - pos_) return Status(Code::kProtocol, "frame body is shorter than its fields");
    *out = p_ + pos_;
    pos_ += n;
    return Status::Ok();
  }
  size_t remaining() const { return n_ - pos_; }
  Status ExpectEnd() const {
    if (pos_ != n_) return Status(Code::kProtocol, "frame body has trailing bytes");
    return Status::Ok();
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

}  // namespace rlboost
