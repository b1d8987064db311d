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
  // Nothing may follow a closed call but whitespace.
  ToolCallMatcher m = required;
  ASSERT_TRUE(m.FeedAll(R"(<tool_call>{"name":"get_time","arguments":{"tz":2}}</tool_call>)"));
  EXPECT_TRUE(m.Closed());
  EXPECT_TRUE(m.Feed('\n'));
  EXPECT_FALSE(m.Feed('x'));
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
  auto call = ParseToolCall(
      "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": 3}}\n"
      "</tool_call>\n");
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->name, "get_time");
  EXPECT_EQ(nlohmann::json::parse(call->arguments_json), nlohmann::json({{"tz", 3}}));
  EXPECT_FALSE(ParseToolCall("plain text").has_value());
  EXPECT_FALSE(ParseToolCall(R"(<tool_call>{"name":"x"}</tool_call>)").has_value());
  EXPECT_FALSE(ParseToolCall(R"(<tool_call>{"name":"x","arguments":{}}</tool_call> and more)"));
  EXPECT_TRUE(MayBeToolCall("  <tool"));
  EXPECT_TRUE(MayBeToolCall("<tool_call>{\"na"));
  EXPECT_TRUE(MayBeToolCall(""));
  EXPECT_FALSE(MayBeToolCall("<b>"));
  EXPECT_FALSE(MayBeToolCall("Hello"));
}

}  // namespace
}  // namespace tandem::structured
