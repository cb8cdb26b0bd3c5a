// The delta codec and the request-state codec: what is encoded decodes to the same bytes,
// and a flipped, cut or lengthened buffer is a kProtocol error, never a crash or a write
// out of bounds.
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "migration/state_codec.h"
#include "weights/delta_codec.h"

namespace rlboost {
namespace {

std::vector<uint8_t> Bytes(const EncodedDelta& d) {
  std::vector<uint8_t> out(d.size());
  d.WriteTo(out.data());
  return out;
}

TEST(DeltaCodec, ASparseChangeRoundTripsAndStaysSmall) {
  const uint64_t n = 1 << 20;
  std::vector<uint8_t> base(n), target;
  std::mt19937 rng(3);
  for (auto& b : base) b = static_cast<uint8_t>(rng());
  target = base;
  for (uint64_t i = 0; i < n; i += 4099) target[i] ^= 1;
  DeltaHeader h;
  h.base = 1;
  h.target = 2;
  h.total_bytes = n;
  h.block_bytes = 64 << 10;
  EncodedDelta d;
  ASSERT_TRUE(EncodeDelta(base.data(), target.data(), h, 2, &d).ok());
  EXPECT_LT(d.size(), n / 8);
  std::vector<uint8_t> delta = Bytes(d), out(n);
  DeltaHeader read;
  ASSERT_TRUE(ApplyDelta(delta.data(), delta.size(), base.data(), out.data(), n, 2, &read).ok());
  EXPECT_EQ(out, target);
  EXPECT_EQ(read.target, 2);
}

TEST(DeltaCodec, EveryTruncationAndManyFlipsAreProtocolErrorsOrExactBytes) {
  const uint64_t n = 64 << 10;
  std::vector<uint8_t> base(n, 7), target(base);
  for (uint64_t i = 0; i < n; i += 97) target[i] = static_cast<uint8_t>(i);
  DeltaHeader h;
  h.total_bytes = n;
  h.block_bytes = 4096;
  EncodedDelta d;
  ASSERT_TRUE(EncodeDelta(base.data(), target.data(), h, 1, &d).ok());
  std::vector<uint8_t> delta = Bytes(d), out(n);
  DeltaHeader read;
  for (size_t cut = 0; cut < delta.size(); cut += 61) {
    EXPECT_EQ(ApplyDelta(delta.data(), cut, base.data(), out.data(), n, 1, &read).code(), Code::kProtocol);
  }
  for (size_t at = 0; at < delta.size(); at += 13) {
    std::vector<uint8_t> bad = delta;
    bad[at] ^= 0x5A;
    Status st = ApplyDelta(bad.data(), bad.size(), base.data(), out.data(), n, 1, &read);
    EXPECT_TRUE(st.ok() || st.code() == Code::kProtocol) << st.message();
  }
}

struct States {
  std::vector<uint8_t> records, prompt, output, logprobs, stop;
};

States TwoStates() {
  States s;
  s.records.assign(2 * migration::kStateRecordBytes, 0);
  for (int i = 0; i < 2; ++i) {
    uint8_t* r = s.records.data() + i * migration::kStateRecordBytes;
    const double temperature = 1.0, top_p = 1.0;
    const uint32_t max_new = 8, prompt_len = 3, output_len = 2, stop_len = 0;
    std::memcpy(r + 24, &temperature, 8);
    std::memcpy(r + 32, &top_p, 8);
    std::memcpy(r + 44, &max_new, 4);
    std::memcpy(r + 48, &prompt_len, 4);
    std::memcpy(r + 52, &output_len, 4);
    std::memcpy(r + 56, &stop_len, 4);
  }
  s.prompt.assign(6 * 4, 1);
  s.output.assign(4 * 4, 2);
  s.logprobs.assign(4 * 4, 0);
  return s;
}

TEST(StateCodec, PackedStatesDecodeAndEveryFlippedByteIsCaught) {
  States s = TwoStates();
  migration::StateColumns cols{{s.records.data(), s.records.size()}, {s.prompt.data(), s.prompt.size()},
                               {s.output.data(), s.output.size()},   {s.logprobs.data(), s.logprobs.size()},
                               {s.stop.data(), s.stop.size()},       1};
  migration::StateLayout plan;
  ASSERT_TRUE(migration::PlanStates(cols, &plan).ok());
  std::vector<uint8_t> buf(plan.total);
  migration::WriteStates(cols, plan, buf.data());
  migration::StateLayout got;
  ASSERT_TRUE(migration::DecodeStates(buf.data(), buf.size(), &got).ok());
  EXPECT_EQ(got.count, 2u);
  EXPECT_EQ(got.prompt_tokens, 6u);
  for (size_t at = 0; at < buf.size(); ++at) {
    std::vector<uint8_t> bad = buf;
    bad[at] ^= 0x10;
    EXPECT_EQ(migration::DecodeStates(bad.data(), bad.size(), &got).code(), Code::kProtocol) << "byte " << at;
  }
  EXPECT_EQ(migration::DecodeStates(buf.data(), buf.size() - 1, &got).code(), Code::kProtocol);
}

TEST(StateCodec, ColumnsThatDisagreeAreInvalidArguments) {
  States s = TwoStates();
  s.prompt.resize(5 * 4);  // the records say 6 prompt tokens
  migration::StateColumns cols{{s.records.data(), s.records.size()}, {s.prompt.data(), s.prompt.size()},
                               {s.output.data(), s.output.size()},   {s.logprobs.data(), s.logprobs.size()},
                               {s.stop.data(), s.stop.size()},       1};
  migration::StateLayout plan;
  EXPECT_EQ(migration::PlanStates(cols, &plan).code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace rlboost
