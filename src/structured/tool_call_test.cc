#include "structured/tool_call.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::structured {
namespace {

std::shared_ptr<const Schema> WeatherAndTime() {
  const std::string schema = ToolCallSchema(
      {{"get_weather",
        R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],
            "additionalProperties":false})"},
       {"get_time", R"({"type":"object","properties":{"tz":{"type":"integer"}},"required":["tz"],
            "additionalProperties":false})"}});
  auto compiled = CompileSchema(schema);
  EXPECT_TRUE(compiled.ok()) << compiled.status().ToString();
  return compiled.ok() ? *compiled : nullptr;
}

bool Whole(ToolCallMatcher m, const std::string& text) { return m.FeedAll(text) && m.Complete(); }

TEST(ToolCallTest, ArgumentsFollowTheNamedToolsSchema) {
  const auto s = WeatherAndTime();
  const ToolCallMatcher required(s, /*required=*/true);
  EXPECT_TRUE(
      Whole(required,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
            "</tool_call>"));
  EXPECT_TRUE(
      Whole(required, R"(<tool_call>{"name":"get_time","arguments":{"tz":2}}</tool_call>)"));
  // The arguments of the other tool, a missing argument, arguments before the name, an unknown
  // name, no tags, an unclosed tag: refused or incomplete.
  for (const std::string bad : {
           R"(<tool_call>{"name":"get_time","arguments":{"city":"Oslo"}}</tool_call>)",
           R"(<tool_call>{"name":"get_weather","arguments":{}}</tool_call>)",
           R"(<tool_call>{"arguments":{"tz":1},"name":"get_time"}</tool_call>)",
           R"(<tool_call>{"name":"get_date","arguments":{}}</tool_call>)",
           R"({"name":"get_time","arguments":{"tz":2}})",
           R"(<tool_call>{"name":"get_time","arguments":{"tz":2}})",
           "Sure, the weather is fine.",
       }) {
    EXPECT_FALSE(Whole(required, bad)) << bad;
  }
  // With one call allowed, nothing may follow a closed call but whitespace.
  ToolCallMatcher m = required;
  ASSERT_TRUE(m.FeedAll(R"(<tool_call>{"name":"get_time","arguments":{"tz":2}}</tool_call>)"));
  EXPECT_TRUE(m.Closed());
  EXPECT_TRUE(m.Feed('\n'));
  EXPECT_FALSE(m.Feed('x'));
  EXPECT_FALSE(m.Feed('<'));
}

TEST(ToolCallTest, SeveralCallsUpToTheLimitEachValid) {
  const auto s = WeatherAndTime();
  const std::string weather =
      R"(<tool_call>{"name":"get_weather","arguments":{"city":"Oslo"}}</tool_call>)";
  const std::string time =
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": 1}}\n</tool_call>";
  for (bool required : {true, false}) {
    const ToolCallMatcher two(s, required, /*max_calls=*/2);
    EXPECT_TRUE(Whole(two, weather));
    EXPECT_TRUE(Whole(two, weather + "\n" + time));
    EXPECT_FALSE(Whole(two, weather + "\n" + time + weather));  // a third
    // After a call only another call may follow: no text, no other tag, no invalid call.
    EXPECT_FALSE(Whole(two, weather + " and that is all"));
    EXPECT_FALSE(Whole(two, weather + "<b>"));
    EXPECT_FALSE(
        Whole(two, weather + R"(<tool_call>{"name":"get_time","arguments":{}}</tool_call>)"));
    ToolCallMatcher m = two;
    ASSERT_TRUE(m.FeedAll(weather + "\n<tool_call>"));
    EXPECT_FALSE(m.Complete());  // the second call is open
    EXPECT_EQ(m.calls(), 1);
    ASSERT_TRUE(m.FeedAll(time.substr(std::string("<tool_call>").size())));
    EXPECT_TRUE(m.Complete());
    EXPECT_EQ(m.calls(), 2);
  }
}

TEST(ToolCallTest, AutoAllowsAMessageOrACall) {
  const auto s = WeatherAndTime();
  const ToolCallMatcher automatic(s, /*required=*/false);
  EXPECT_TRUE(Whole(automatic, "It is sunny in Oslo."));
  EXPECT_TRUE(Whole(automatic, "<b>bold</b> answer"));  // begins like the tag, is not one
  EXPECT_TRUE(Whole(automatic, ""));
  EXPECT_TRUE(
      Whole(automatic, R"( <tool_call>{"name":"get_time","arguments":{"tz":1}}</tool_call>)"));
  // Once the tag is complete, the call must be valid.
  EXPECT_FALSE(Whole(automatic, R"(<tool_call>{"name":"nope","arguments":{}}</tool_call>)"));
}

TEST(ToolCallTest, ParsesFinishedAnswers) {
  auto calls = ParseToolCalls(
      "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": 3}}\n"
      "</tool_call>\n");
  ASSERT_TRUE(calls.has_value());
  ASSERT_EQ(calls->size(), 1u);
  EXPECT_EQ((*calls)[0].name, "get_time");
  EXPECT_EQ(nlohmann::json::parse((*calls)[0].arguments_json), nlohmann::json({{"tz", 3}}));
  EXPECT_FALSE(ParseToolCalls("plain text").has_value());
  EXPECT_FALSE(ParseToolCalls("").has_value());
  EXPECT_FALSE(ParseToolCalls(R"(<tool_call>{"name":"x"}</tool_call>)").has_value());
  EXPECT_FALSE(ParseToolCalls(R"(<tool_call>{"name":"x","arguments":{}}</tool_call> and more)"));
  // Several calls in order; a close tag inside an argument string does not end a call.
  auto two =
      ParseToolCalls(R"(<tool_call>{"name":"a","arguments":{"s":"</tool_call>"}}</tool_call>)"
                     "\n <tool_call>{\"name\":\"b\",\"arguments\":{}}</tool_call>");
  ASSERT_TRUE(two.has_value());
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[0].name, "a");
  EXPECT_EQ(nlohmann::json::parse((*two)[0].arguments_json)["s"], "</tool_call>");
  EXPECT_EQ((*two)[1].name, "b");
  EXPECT_TRUE(MayBeToolCall("  <tool"));
  EXPECT_TRUE(MayBeToolCall("<tool_call>{\"na"));
  EXPECT_TRUE(MayBeToolCall(""));
  EXPECT_FALSE(MayBeToolCall("<b>"));
  EXPECT_FALSE(MayBeToolCall("Hello"));
}

}  // namespace
}  // namespace tandem::structured
