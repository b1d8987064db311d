#include "server/stop_matcher.h"

#include <gtest/gtest.h>

namespace tandem::server {
namespace {

// Pushes pieces and returns everything emitted (plus the flush when no stop matched).
std::string Feed(std::vector<std::string> stops, const std::vector<std::string>& pieces,
                 bool* stopped) {
  StopMatcher m(std::move(stops));
  std::string out;
  *stopped = false;
  for (const auto& p : pieces) {
    auto r = m.Push(p);
    out += r.text;
    if (r.stopped) {
      *stopped = true;
      break;
    }
  }
  out += m.Flush();
  return out;
}

TEST(StopMatcherTest, NoStopsPassesThrough) {
  bool stopped;
  EXPECT_EQ(Feed({}, {"a", "b", "c"}, &stopped), "abc");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(Feed({""}, {"a", "b"}, &stopped), "ab");  // empty stop strings are ignored
}

TEST(StopMatcherTest, StopWithinOnePiece) {
  bool stopped;
  EXPECT_EQ(Feed({"END"}, {"abcENDdef"}, &stopped), "abc");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcherTest, StopAcrossPieces) {
  bool stopped;
  EXPECT_EQ(Feed({"END"}, {"ab", "cE", "N", "Dxyz"}, &stopped), "abc");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Feed({"\n\n"}, {"Hello\n", "\nWorld"}, &stopped), "Hello");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcherTest, HeldTextIsReleasedWhenItDiverges) {
  StopMatcher m({"END"});
  auto r = m.Push("abcE");
  EXPECT_EQ(r.text, "abc");  // "E" may start "END"
  r = m.Push("N");
  EXPECT_EQ(r.text, "");
  r = m.Push("x");
  EXPECT_EQ(r.text, "ENx");
  EXPECT_FALSE(r.stopped);
}

TEST(StopMatcherTest, PartialStopAtEndIsFlushed) {
  bool stopped;
  EXPECT_EQ(Feed({"END"}, {"abc", "EN"}, &stopped), "abcEN");
  EXPECT_FALSE(stopped);
}

TEST(StopMatcherTest, EarliestOfSeveralStopsWins) {
  bool stopped;
  EXPECT_EQ(Feed({"world", "lo w"}, {"hello world"}, &stopped), "hel");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Feed({"bc", "abcd"}, {"xa", "b", "c", "d"}, &stopped), "xa");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcherTest, OverlappingPrefixes) {
  // "aab" inside "aaab": the hold-back must keep "aa" after seeing "aaa".
  bool stopped;
  EXPECT_EQ(Feed({"aab"}, {"a", "a", "a", "b", "c"}, &stopped), "a");
  EXPECT_TRUE(stopped);
}

TEST(StopMatcherTest, NothingAfterStop) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.Push("ax").stopped);
  auto r = m.Push("more");
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(m.Flush(), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcherTest, MultiByteStops) {
  bool stopped;
  EXPECT_EQ(Feed({"é!"}, {"caf", "é", "!", " tail"}, &stopped), "caf");
  EXPECT_TRUE(stopped);
  // A held multi-byte prefix is released whole.
  StopMatcher m({"éa"});
  EXPECT_EQ(m.Push("xé").text, "x");
  EXPECT_EQ(m.Push("b").text, "éb");
}

}  // namespace
}  // namespace tandem::server
