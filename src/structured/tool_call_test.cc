#include "structured/tool_call.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace tandem::structured {
namespace {

std::shared_ptr<const Schema> WeatherAndTime(std::string_view arguments_key = "arguments") {
  const std::string schema = ToolCallSchema(
      {{"get_weather",
        R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"],
            "additionalProperties":false})"},
       {"get_time", R"({"type":"object","properties":{"tz":{"type":"integer"}},"required":["tz"],
            "additionalProperties":false})"}},
      arguments_key);
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

TEST(ToolCallTest, Llama3JsonCallsAreBareObjectsJoinedBySemicolons) {
  const auto s = WeatherAndTime("parameters");
  const std::string weather = R"({"name": "get_weather", "parameters": {"city": "Oslo"}})";
  const std::string time = R"({"name":"get_time","parameters":{"tz":1}})";
  for (bool required : {true, false}) {
    const ToolCallMatcher two(s, required, /*max_calls=*/2, ToolFormat::kLlama3Json);
    EXPECT_TRUE(Whole(two, weather));
    EXPECT_TRUE(Whole(two, "\n" + weather + "; " + time + "\n"));
    EXPECT_FALSE(Whole(two, weather + ";" + time + ";" + weather));  // a third
    EXPECT_FALSE(Whole(two, weather + " done"));
    EXPECT_FALSE(Whole(two, R"({"name":"get_time","arguments":{"tz":1}})"));  // the wrong key
    // Another format's call: refused, or in auto mode a message.
    EXPECT_EQ(Whole(two, R"(<tool_call>{"name":"get_time","parameters":{"tz":1}}</tool_call>)"),
              !required);
    ToolCallMatcher m = two;
    ASSERT_TRUE(m.FeedAll(weather + ";"));
    EXPECT_FALSE(m.Complete());  // a separator promises another call
    EXPECT_EQ(m.calls(), 1);
  }
  const ToolCallMatcher automatic(s, /*required=*/false, 1, ToolFormat::kLlama3Json);
  EXPECT_TRUE(Whole(automatic, "It is sunny."));
  EXPECT_TRUE(Whole(automatic, "<tool_call> is not this format's tag"));
  EXPECT_FALSE(Whole(automatic, R"({"name":"nope","parameters":{}})"));  // '{' begins a call

  auto calls = ParseToolCalls(weather + " ;\n" + time, ToolFormat::kLlama3Json);
  ASSERT_TRUE(calls.has_value());
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "get_weather");
  EXPECT_EQ(nlohmann::json::parse((*calls)[0].arguments_json), nlohmann::json({{"city", "Oslo"}}));
  EXPECT_EQ((*calls)[1].name, "get_time");
  EXPECT_FALSE(ParseToolCalls(weather + "; and text", ToolFormat::kLlama3Json).has_value());
  EXPECT_FALSE(ParseToolCalls("Hello", ToolFormat::kLlama3Json).has_value());
  EXPECT_TRUE(MayBeToolCall(" {\"na", ToolFormat::kLlama3Json));
  EXPECT_FALSE(MayBeToolCall("<tool_call>", ToolFormat::kLlama3Json));
}

TEST(ToolCallTest, MistralCallsAreAListAfterTheMarker) {
  const auto s = WeatherAndTime();
  const std::string weather = R"({"name": "get_weather", "arguments": {"city": "Oslo"}})";
  const std::string time = R"({"name":"get_time","arguments":{"tz":1}})";
  for (bool required : {true, false}) {
    const ToolCallMatcher two(s, required, /*max_calls=*/2, ToolFormat::kMistral);
    EXPECT_TRUE(Whole(two, "[TOOL_CALLS] [" + weather + "]"));
    EXPECT_TRUE(Whole(two, "[TOOL_CALLS][" + weather + ", " + time + "]\n"));
    EXPECT_FALSE(Whole(two, "[TOOL_CALLS] [" + weather));  // the list is not closed
    EXPECT_FALSE(Whole(two, "[TOOL_CALLS] [" + weather + "," + time + "," + weather + "]"));
    EXPECT_FALSE(Whole(two, "[TOOL_CALLS] [" + weather + "] more"));
    EXPECT_EQ(Whole(two, "[" + weather + "]"), !required);  // no marker: a message in auto
  }
  const ToolCallMatcher automatic(s, /*required=*/false, 1, ToolFormat::kMistral);
  EXPECT_TRUE(Whole(automatic, "[1] is a footnote"));  // leaves the marker: a message
  EXPECT_TRUE(Whole(automatic, "Sunny."));
  EXPECT_FALSE(Whole(automatic, R"([TOOL_CALLS] [{"name":"nope","arguments":{}}])"));

  // A model's call may carry extra keys (Mistral's "id"): ignored.
  auto calls = ParseToolCalls(
      R"( [TOOL_CALLS] [{"name":"get_time","arguments":{"tz":1},"id":"a1b2c3d4e"}, )" + weather +
          "]",
      ToolFormat::kMistral);
  ASSERT_TRUE(calls.has_value());
  ASSERT_EQ(calls->size(), 2u);
  EXPECT_EQ((*calls)[0].name, "get_time");
  EXPECT_EQ((*calls)[1].name, "get_weather");
  EXPECT_FALSE(ParseToolCalls("[TOOL_CALLS] [" + weather, ToolFormat::kMistral).has_value());
  EXPECT_FALSE(ParseToolCalls("[" + weather + "]", ToolFormat::kMistral).has_value());
  EXPECT_TRUE(MayBeToolCall("[TOOL", ToolFormat::kMistral));
  EXPECT_TRUE(MayBeToolCall("[TOOL_CALLS] [{", ToolFormat::kMistral));
  EXPECT_FALSE(MayBeToolCall("[1]", ToolFormat::kMistral));
}

std::string TemplateText(const std::string& name) {
  const char* src = std::getenv("TANDEM_SOURCE_DIR");
  const std::filesystem::path path =
      std::filesystem::path(src ? src : ".") / "tests" / "golden" / "jinja" / "templates" / name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(ToolCallTest, TheFormatIsReadFromTheTemplate) {
  EXPECT_EQ(ToolFormatOfTemplate(TemplateText("chatml_tools.jinja")), ToolFormat::kHermes);
  EXPECT_EQ(ToolFormatOfTemplate(TemplateText("llama3_style.jinja")), ToolFormat::kLlama3Json);
  EXPECT_EQ(ToolFormatOfTemplate(TemplateText("mistral_style.jinja")), ToolFormat::kMistral);
  EXPECT_EQ(ToolFormatOfTemplate(TemplateText("smollm2.jinja")), ToolFormat::kHermes);
  for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3Json, ToolFormat::kMistral}) {
    EXPECT_EQ(ToolFormatNamed(ToolFormatName(f)), f);
  }
  EXPECT_FALSE(ToolFormatNamed("json").has_value());
}

}  // namespace
}  // namespace tandem::structured
