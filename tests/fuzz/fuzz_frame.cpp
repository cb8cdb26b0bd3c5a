// Frame parser: a 24-byte header (magic, format, type, bound), then the bodies a server or
// puller decodes without a seal: version bodies and error frames. Every input must give a
// Status, never a crash, and a header that decodes must bound its body.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/frame.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace rlboost;
  if (size < kFrameHeaderBytes) return 0;
  FrameHeader h;
  if (!DecodeFrameHeader(data, &h).ok()) return 0;
  if (h.length > MaxFrameBody(h.type)) __builtin_trap();  // a decoded header is within its bound
  const uint8_t* body = data + kFrameHeaderBytes;
  const size_t n = size - kFrameHeaderBytes;
  if (h.type == FrameType::kError) {
    Status st = DecodeErrorBody(body, n);
    for (char c : st.message()) {
      if (c < 0x20 || c >= 0x7F) __builtin_trap();  // a peer's words reach users printable
    }
  }
  int64_t version = 0;
  (void)DecodeVersionBody(std::string(reinterpret_cast<const char*>(body), n), &version);
  (void)IsClientFrame(h.type);
  (void)FrameTypeName(h.type);
  return 0;
}
