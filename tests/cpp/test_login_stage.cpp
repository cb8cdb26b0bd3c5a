// Login budgets and admission: limits below 1 and a failed epoll are typed errors, one
// address cannot hold more than its share of pending logins, and only an address that
// MarkGood named (a request verified under its login's keys) waits in the reserved slots
// a flood from other addresses never takes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "channel/frame_io.h"
#include "channel/handshake.h"
#include "channel/login_stage.h"
#include "channel/socket.h"
#include "fault_injection.h"
#include "weights/server.h"

namespace rlboost {
namespace {

const std::string kSecret = "login-stage-secret";

template <typename F>
bool WaitFor(F done, double seconds = 10.0) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return true;
}

// A connection from a chosen loopback address (127.0.0.x) that sends the first byte of a
// frame ("R" of the magic) and then nothing: a login stalled mid-frame. (One that sends no
// byte at all is not handed to the server yet: the listener defers accepting it.)
Socket HoldFrom(const char* from, int port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, from, &a.sin_addr);
  EXPECT_EQ(::bind(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  EXPECT_EQ(::connect(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const char first = 'R';
  EXPECT_EQ(::send(s.fd(), &first, 1, MSG_NOSIGNAL), 1);
  return s;
}

// True once the server closed this connection (end of stream, or a reset: closed with our
// byte unread), false if it stays open.
bool ClosedByServer(const Socket& s, int wait_ms = 5000) {
  pollfd p{s.fd(), POLLIN, 0};
  if (::poll(&p, 1, wait_ms) <= 0) return false;
  char c;
  ssize_t n = ::recv(s.fd(), &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

class LoginStageTest : public ::testing::Test {
 protected:
  void Start(LoginLimits limits) {
    ASSERT_TRUE(ListenTcp("127.0.0.1", 0, &listener_, &port_).ok());
    PeerIdentity self;
    self.server_id = 42;
    ASSERT_TRUE(LoginStage::Create(listener_, kSecret, self, EncryptPolicy::kOff, limits, &counts_,
                                   [this](Socket s, uint64_t, const std::string&, const std::string& welcome,
                                          std::shared_ptr<FrameSeal>) {
                                     // What the server's connection thread does first.
                                     EXPECT_TRUE(SendFrame(s, FrameType::kWelcome, 0, 0, welcome,
                                                           Deadline::After(5)).ok());
                                     served_.push_back(std::move(s));
                                     ++logins_;
                                   },
                                   &stage_)
                    .ok());
    thread_ = std::thread([this] { EXPECT_TRUE(stage_->Run(closing_).ok()); });
  }
  void TearDown() override {
    closing_ = true;
    if (thread_.joinable()) thread_.join();
  }
  Socket listener_;
  int port_ = 0;
  LoginCounts counts_;
  std::unique_ptr<LoginStage> stage_;
  std::atomic<bool> closing_{false};
  std::atomic<int> logins_{0};
  std::vector<Socket> served_;  // logins handed over (the stage's thread only)
  std::thread thread_;
};

TEST(LoginStageCreate, LimitsBelowOneAreInvalidArguments) {
  Socket listener;
  int port = 0;
  ASSERT_TRUE(ListenTcp("127.0.0.1", 0, &listener, &port).ok());
  LoginCounts counts;
  std::unique_ptr<LoginStage> stage;
  for (auto [slots, per_host] : {std::pair{0, 4}, std::pair{4, 0}, std::pair{-1, -1}}) {
    LoginLimits limits;
    limits.slots = slots;
    limits.per_host = per_host;
    Status st = LoginStage::Create(listener, kSecret, PeerIdentity{}, EncryptPolicy::kOff, limits, &counts, nullptr,
                                   &stage);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.message();
  }
}

TEST(LoginStageCreate, AFailedEpollCreateIsATypedErrorOfTheServersStart) {
  ServerOptions opts;
  opts.secret = kSecret;
  std::unique_ptr<WeightServer> server;
  testing::fail_epoll_create = true;
  Status st = WeightServer::Start(opts, std::make_shared<VersionStore>(1, kSecret), &server);
  testing::fail_epoll_create = false;
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_NE(st.message().find("epoll_create1"), std::string::npos) << st.message();
  EXPECT_EQ(server, nullptr);
}

TEST(LoginStageCreate, ZeroHandshakeSlotsAreRefusedByTheServersStart) {
  ServerOptions opts;
  opts.secret = kSecret;
  opts.limits.max_handshakes = 0;
  std::unique_ptr<WeightServer> server;
  Status st = WeightServer::Start(opts, std::make_shared<VersionStore>(1, kSecret), &server);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.message();
}

TEST_F(LoginStageTest, AnAddressOverItsShareLosesItsOldestPendingLogin) {
  LoginLimits limits;
  limits.slots = 16;
  limits.per_host = 2;
  Start(limits);
  Socket first = HoldFrom("127.0.0.2", port_);
  Socket second = HoldFrom("127.0.0.2", port_);
  Socket third = HoldFrom("127.0.0.2", port_);
  EXPECT_TRUE(ClosedByServer(first));
  EXPECT_TRUE(WaitFor([&] { return counts_.accepted.load() == 3 && counts_.dropped.load() == 1; }));
  EXPECT_FALSE(ClosedByServer(third, 0));
}

TEST_F(LoginStageTest, AFinishedLoginAloneEarnsNoReservedSlot) {
  LoginLimits limits;
  limits.slots = 1;
  limits.per_host = 8;
  Start(limits);
  Socket honest;
  ASSERT_TRUE(ConnectTcp("127.0.0.1", port_, Deadline::After(5), &honest).ok());
  PeerIdentity server;
  ASSERT_TRUE(ClientHandshake(honest, kSecret, EncryptPolicy::kOff, Deadline::After(5), &server).ok());
  EXPECT_EQ(server.server_id, 42u);
  // The login finished, but no request proved it: its address is not reserved, so a
  // newcomer from another address takes the one slot from its next login.
  Socket next = HoldFrom("127.0.0.1", port_);
  EXPECT_TRUE(WaitFor([&] { return counts_.accepted.load() == 2; }));
  Socket flood = HoldFrom("127.0.0.3", port_);
  EXPECT_TRUE(ClosedByServer(next));
}

TEST_F(LoginStageTest, AnAddressMarkedGoodLogsInThroughAFloodFromOthers) {
  LoginLimits limits;
  limits.slots = 2;
  limits.per_host = 8;
  Start(limits);
  stage_->MarkGood("127.0.0.1");
  Socket honest;
  // Connected first, but handed to the server only with its hello (the listener defers
  // accepting a connection until its first bytes): it arrives into a full stage.
  ASSERT_TRUE(ConnectTcp("127.0.0.1", port_, Deadline::After(5), &honest).ok());
  std::vector<Socket> flood;
  for (int i = 0; i < 6; ++i) flood.push_back(HoldFrom("127.0.0.4", port_));
  // The count of accepts moves before the admission that drops: wait for both.
  EXPECT_TRUE(WaitFor([&] { return counts_.accepted.load() == 6 && counts_.dropped.load() == 4; }));
  PeerIdentity server;
  Status st = ClientHandshake(honest, kSecret, EncryptPolicy::kOff, Deadline::After(5), &server);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(WaitFor([&] { return logins_.load() == 1; }));
}

}  // namespace
}  // namespace rlboost
