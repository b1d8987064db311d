#include "common/status.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tandem
