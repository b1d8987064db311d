#include "common/status.h"

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/http_status.h"

namespace tandem {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status Quarter(int x, int* out) {
  TANDEM_ASSIGN_OR_RETURN(int h, Half(x));
  TANDEM_ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST(StatusTest, PropagatesFirstError) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status st = Quarter(6, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.ToString(), "INVALID_ARGUMENT: odd: 3");
  EXPECT_EQ(st.WithContext("quarter").message(), "quarter: odd: 3");
}

// value() on an error aborts in every build mode, Release (NDEBUG) included, naming the error.
TEST(StatusDeathTest, ValueOfAnErrorAbortsWithItsText) {
  StatusOr<int> odd = Half(3);
  EXPECT_DEATH((void)odd.value(), "INVALID_ARGUMENT: odd: 3");
  EXPECT_DEATH((void)*Half(5), "odd: 5");
}

TEST(StatusTest, OkStatusWithoutValueBecomesAnError) {
  StatusOr<int> s = OkStatus();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInternal);
}

TEST(CheckDeathTest, FailedCheckNamesConditionAndContext) {
  int n = 7;
  TANDEM_CHECK(n == 7) << "never printed";
  EXPECT_DEATH(TANDEM_CHECK(n % 2 == 0) << "n=" << n, "check failed: n % 2 == 0 n=7");
  EXPECT_DEATH(TANDEM_CHECK_OK(InvalidArgument("bad")), "INVALID_ARGUMENT: bad");
}

// Every code the HTTP services produce comes back as a code with the same HTTP status, and the
// canonical ones as themselves.
TEST(HttpStatusTest, StatusCodesSurviveTheRoundTrip) {
  for (int c = 0; c <= static_cast<int>(kLastStatusCode); ++c) {
    const auto code = static_cast<StatusCode>(c);
    const int http = HttpStatusFor(code);
    EXPECT_EQ(HttpStatusFor(StatusCodeForHttp(http)), http) << StatusCodeName(code);
  }
  for (StatusCode code :
       {StatusCode::kOk, StatusCode::kInvalidArgument, StatusCode::kNotFound,
        StatusCode::kResourceExhausted, StatusCode::kUnimplemented, StatusCode::kUnavailable,
        StatusCode::kDeadlineExceeded, StatusCode::kInternal}) {
    EXPECT_EQ(StatusCodeForHttp(HttpStatusFor(code)), code) << StatusCodeName(code);
  }
  EXPECT_EQ(StatusCodeForHttp(418), StatusCode::kInternal);
  EXPECT_EQ(StatusCodeForHttp(204), StatusCode::kOk);
}

}  // namespace
}  // namespace tandem
