// Frame seal and open: every frame after a login verifies only once, in order, unaltered,
// under the keys of its own direction; a sealed frame's nonce is never reused; a forked
// child cannot use its parent's seal; a cipher context libcrypto cannot make is an error.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "channel/frame_seal.h"
#include "common/frame.h"
#include "fault_injection.h"

namespace rlboost {
namespace {

struct Frame {
  uint8_t head[kFrameHeaderBytes];
  std::vector<uint8_t> body;
  uint8_t tag[kFrameTagBytes];
};

Key256 KeyOf(uint8_t fill) {
  Key256 k;
  k.fill(fill);
  return k;
}

Frame Seal(FrameCipher& c, const std::string& text, uint64_t request_id = 7) {
  Frame f;
  FrameHeader h;
  h.type = FrameType::kManifest;
  h.length = static_cast<uint32_t>(text.size());
  h.request_id = request_id;
  EncodeFrameHeader(h, f.head);
  f.body.assign(text.begin(), text.end());
  EXPECT_TRUE(c.Begin(f.head).ok());
  EXPECT_TRUE(c.Cover(f.body.data(), f.body.data(), f.body.size()).ok());
  EXPECT_TRUE(c.Tag(f.tag).ok());
  return f;
}

bool Open(FrameCipher& c, Frame f, std::string* text = nullptr) {
  if (!c.Begin(f.head).ok() || !c.Cover(f.body.data(), f.body.data(), f.body.size()).ok()) return false;
  if (!c.Check(f.tag)) return false;
  if (text != nullptr) text->assign(f.body.begin(), f.body.end());
  return true;
}

class FrameSealTest : public ::testing::TestWithParam<SealMode> {
 protected:
  void SetUp() override {
    if (GetParam() == SealMode::kAead && !AeadBuilt()) GTEST_SKIP() << "built without libcrypto";
    ASSERT_TRUE(FrameSeal::Create(GetParam(), KeyOf(1), KeyOf(2), false, &client_).ok());
    ASSERT_TRUE(FrameSeal::Create(GetParam(), KeyOf(2), KeyOf(1), true, &server_).ok());
  }
  std::shared_ptr<FrameSeal> client_, server_;
};

TEST_P(FrameSealTest, FramesOpenInOrderAndSayWhatTheyCarry) {
  for (int i = 0; i < 3; ++i) {
    std::string sent = "request " + std::to_string(i), got;
    ASSERT_TRUE(Open(server_->recv(), Seal(client_->send(), sent), &got));
    EXPECT_EQ(got, sent);
  }
}

TEST_P(FrameSealTest, AnAlteredHeaderBodyOrTagFailsItsCheck) {
  for (int part = 0; part < 3; ++part) {
    std::shared_ptr<FrameSeal> a, b;
    ASSERT_TRUE(FrameSeal::Create(GetParam(), KeyOf(1), KeyOf(2), false, &a).ok());
    ASSERT_TRUE(FrameSeal::Create(GetParam(), KeyOf(2), KeyOf(1), true, &b).ok());
    Frame f = Seal(a->send(), "weights");
    if (part == 0) f.head[16] ^= 1;  // the request id
    if (part == 1) f.body[0] ^= 1;
    if (part == 2) f.tag[15] ^= 1;
    EXPECT_FALSE(Open(b->recv(), f)) << "part " << part;
  }
}

TEST_P(FrameSealTest, AReplayedDroppedOrReorderedFrameFails) {
  Frame first = Seal(client_->send(), "one");
  Frame second = Seal(client_->send(), "two");
  ASSERT_TRUE(Open(server_->recv(), first));
  EXPECT_FALSE(Open(server_->recv(), first));  // replayed: the counter moved on
  std::shared_ptr<FrameSeal> fresh;
  ASSERT_TRUE(FrameSeal::Create(GetParam(), KeyOf(2), KeyOf(1), true, &fresh).ok());
  EXPECT_FALSE(Open(fresh->recv(), second));  // the first was dropped
}

TEST_P(FrameSealTest, AFrameForOneDirectionFailsInTheOther) {
  Frame f = Seal(client_->send(), "to the server");
  EXPECT_FALSE(Open(client_->recv(), f));
}

TEST_P(FrameSealTest, TheSameFrameSealedTwiceNeverRepeatsItsTag) {
  // The counter is the nonce: equal plaintexts under one key must not seal alike (a
  // repeated AES-GCM nonce would give away the XOR of two plaintexts and the GHASH key).
  Frame a = Seal(client_->send(), "same bytes");
  Frame b = Seal(client_->send(), "same bytes");
  EXPECT_NE(0, std::memcmp(a.tag, b.tag, kFrameTagBytes));
  if (GetParam() == SealMode::kAead) EXPECT_NE(a.body, b.body);
}

TEST_P(FrameSealTest, AForkedChildCannotUseItsParentsSeal) {
  ASSERT_TRUE(client_->CheckOwner().ok());
  pid_t pid = fork();
  if (pid == 0) _exit(client_->CheckOwner().code() == Code::kClosed ? 0 : 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, FrameSealTest, ::testing::Values(SealMode::kMac, SealMode::kAead),
                         [](const auto& info) { return info.param == SealMode::kMac ? "Mac" : "Aead"; });

TEST(FrameSealCreate, ANullCipherContextIsATypedError) {
  if (!AeadBuilt()) GTEST_SKIP() << "built without libcrypto";
  testing::fail_cipher_context = true;
  std::shared_ptr<FrameSeal> seal;
  Status st = FrameSeal::Create(SealMode::kAead, KeyOf(1), KeyOf(2), false, &seal);
  testing::fail_cipher_context = false;
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("EVP_CIPHER_CTX_new"), std::string::npos) << st.message();
  EXPECT_EQ(seal, nullptr);
}

}  // namespace
}  // namespace rlboost
