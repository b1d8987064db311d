#include "server/http_util.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/listen_backlog.h"

namespace tandem::server {
namespace {

using serving::FinishReason;

TEST(HttpUtilTest, SubmitErrors) {
  Outcome o = Outcome::kSuccess;
  EXPECT_EQ(SubmitError(ResourceExhausted("full"), &o).status, 429);
  EXPECT_EQ(o, Outcome::kRejected);
  EXPECT_EQ(SubmitError(FailedPrecondition("draining"), &o).status, 503);
  EXPECT_EQ(o, Outcome::kRejected);
  const ApiError e = SubmitError(OutOfRange("too long for the KV cache"), &o);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.message, "too long for the KV cache");
  EXPECT_EQ(o, Outcome::kBadRequest);
  EXPECT_EQ(SubmitError(Internal("boom"), &o).status, 500);
  EXPECT_EQ(o, Outcome::kError);
}

TEST(HttpUtilTest, FailureErrorsAndNames) {
  serving::FinishInfo info;
  info.reason = FinishReason::kTimeout;
  EXPECT_EQ(FailureError(info, 600).status, 504);
  EXPECT_NE(FailureError(info, 600).message.find("600 s"), std::string::npos);
  info.reason = FinishReason::kCancelled;
  EXPECT_EQ(FailureError(info, 600).status, 503);
  info.reason = FinishReason::kError;
  info.message = "engine failed";
  EXPECT_EQ(FailureError(info, 600).status, 500);
  EXPECT_NE(FailureError(info, 600).message.find("engine failed"), std::string::npos);
  EXPECT_STREQ(serving::FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_STREQ(serving::FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(OutcomeOf(FinishReason::kStop), Outcome::kSuccess);
  EXPECT_EQ(OutcomeOf(FinishReason::kTimeout), Outcome::kTimeout);
}

TEST(HttpUtilTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secre"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(HttpUtilTest, WidenListenBacklogFindsTheSocket) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);  // accept() must not block
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  WidenListenBacklog(port);
  // More pending connections than the original backlog of 1 complete their handshakes.
  std::vector<int> clients;
  for (int i = 0; i < 16; ++i) {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    clients.push_back(c);
  }
  int accepted = 0;
  ::usleep(100 * 1000);
  while (true) {
    const int a = ::accept(fd, nullptr, nullptr);
    if (a < 0) break;
    ++accepted;
    ::close(a);
  }
  EXPECT_EQ(accepted, 16);
  for (int c : clients) ::close(c);
  ::close(fd);
}

}  // namespace
}  // namespace tandem::server
