#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace tandem::server {
namespace {

using nlohmann::json;

ResponseContext Ctx(Endpoint e, bool include_usage = false) {
  return {e, "id-1", 1700000000, "smol", include_usage};
}

TEST(OpenAiResponseTest, RequestIdsArePrefixedAndUnique) {
  const std::string a = NewRequestId(Endpoint::kChatCompletions);
  const std::string b = NewRequestId(Endpoint::kChatCompletions);
  EXPECT_EQ(a.rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(NewRequestId(Endpoint::kCompletions).rfind("cmpl-", 0), 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.size(), std::string("chatcmpl-").size() + 24);
}

TEST(OpenAiResponseTest, ChatCompletionBody) {
  const json j =
      json::parse(CompletionBody(Ctx(Endpoint::kChatCompletions), "Hi!", "stop", {10, 3, 4}));
  EXPECT_EQ(j["id"], "id-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "smol");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 13);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(OpenAiResponseTest, TextCompletionBody) {
  const json j =
      json::parse(CompletionBody(Ctx(Endpoint::kCompletions), "abc", "length", {1, 2, 0}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "abc");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponseTest, SseFraming) {
  EXPECT_EQ(SseEvent("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_STREQ(kSseDone, "data: [DONE]\n\n");
  // Newlines in the text are escaped inside the JSON, so one event stays one line.
  const std::string ev = SseEvent(TextChunk(Ctx(Endpoint::kChatCompletions), "a\nb\n\n"));
  EXPECT_EQ(ev.find('\n'), ev.size() - 2);
}

TEST(OpenAiResponseTest, ChatChunks) {
  const auto ctx = Ctx(Endpoint::kChatCompletions);
  json role = json::parse(ChatRoleChunk(ctx));
  EXPECT_EQ(role["object"], "chat.completion.chunk");
  EXPECT_EQ(role["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(role["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(role.contains("usage"));
  json text = json::parse(TextChunk(ctx, "tok"));
  EXPECT_EQ(text["choices"][0]["delta"]["content"], "tok");
  json fin = json::parse(FinishChunk(ctx, "length"));
  EXPECT_TRUE(fin["choices"][0]["delta"].is_object());
  EXPECT_TRUE(fin["choices"][0]["delta"].empty());
  EXPECT_EQ(fin["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiResponseTest, CompletionChunksAndUsage) {
  const auto ctx = Ctx(Endpoint::kCompletions, /*include_usage=*/true);
  json text = json::parse(TextChunk(ctx, "x"));
  EXPECT_EQ(text["object"], "text_completion");
  EXPECT_EQ(text["choices"][0]["text"], "x");
  EXPECT_TRUE(text.contains("usage"));
  EXPECT_TRUE(text["usage"].is_null());
  json usage = json::parse(UsageChunk(ctx, {5, 6, 0}));
  EXPECT_TRUE(usage["choices"].is_array());
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 11);
}

TEST(OpenAiResponseTest, InvalidUtf8IsReplacedNotThrown) {
  std::string out;
  EXPECT_NO_THROW(out = TextChunk(Ctx(Endpoint::kChatCompletions), "bad \xff\xfe end"));
  const json j = json::parse(out);
  EXPECT_EQ(j["choices"][0]["delta"]["content"], "bad \xEF\xBF\xBD\xEF\xBF\xBD end");
}

TEST(OpenAiResponseTest, ErrorShape) {
  ApiError e{404, "no such model", "invalid_request_error", "model", "model_not_found"};
  json j = json::parse(ApiErrorJson(e));
  EXPECT_EQ(j["error"]["message"], "no such model");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "model");
  EXPECT_EQ(j["error"]["code"], "model_not_found");
  j = json::parse(ApiErrorJson(ApiError::BadRequest("x")));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"]["code"].is_null());
}

TEST(OpenAiResponseTest, ModelsList) {
  json j = json::parse(ModelsBody({"smol"}, 5));
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "smol");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST(OpenAiResponseTest, ChatLogprobsShape) {
  ResponseContext ctx = Ctx(Endpoint::kChatCompletions);
  ctx.logprobs = true;
  const std::vector<TokenLogprobs> lps = {{"Hi", -0.25f, {{"Hi", -0.25f}, {"Hello", -1.5f}}},
                                          {"\xe2\x82", -0.5f, {}}};
  const Choice choice{0, "Hi", "stop", lps};
  const json j = json::parse(CompletionBody(ctx, std::span(&choice, 1), {3, 2, 0}));
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hi");
  EXPECT_FLOAT_EQ(content[0]["logprob"].get<float>(), -0.25f);
  EXPECT_EQ(content[0]["bytes"], json::array({72, 105}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "Hello");
  // Part of a UTF-8 character: OpenAI's escaped form, the exact bytes beside it.
  EXPECT_EQ(content[1]["token"], "bytes:\\xe2\\x82");
  EXPECT_EQ(content[1]["bytes"], json::array({0xe2, 0x82}));
  EXPECT_TRUE(j["choices"][0]["logprobs"]["refusal"].is_null());
}

TEST(OpenAiResponseTest, CompletionLogprobsShapeAndOffsets) {
  ResponseContext ctx = Ctx(Endpoint::kCompletions);
  ctx.logprobs = true;
  const std::vector<TokenLogprobs> lps = {{"ab", -0.1f, {{"x", -3.0f}}}, {"cde", -0.2f, {}}};
  const json chunk = json::parse(TextChunk(ctx, "abcde", 2, lps, 10));
  EXPECT_EQ(chunk["choices"][0]["index"], 2);
  const json& l = chunk["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json::array({"ab", "cde"}));
  EXPECT_EQ(l["text_offset"], json::array({10, 12}));
  EXPECT_FLOAT_EQ(l["token_logprobs"][1].get<float>(), -0.2f);
  // The map holds the token itself and its alternatives.
  EXPECT_EQ(l["top_logprobs"][0].size(), 2u);
  EXPECT_FLOAT_EQ(l["top_logprobs"][0]["x"].get<float>(), -3.0f);
  // Without logprobs: null, as before.
  EXPECT_TRUE(
      json::parse(TextChunk(Ctx(Endpoint::kCompletions), "a"))["choices"][0]["logprobs"].is_null());
}

TEST(OpenAiResponseTest, SeveralChoicesInIndexOrder) {
  const std::vector<Choice> choices = {{0, "a", "stop", {}}, {1, "b", "length", {}}};
  const json j = json::parse(CompletionBody(Ctx(Endpoint::kChatCompletions), choices, {5, 7, 0}));
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][1]["index"], 1);
  EXPECT_EQ(j["choices"][1]["message"]["content"], "b");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["total_tokens"], 12);
}

}  // namespace
}  // namespace tandem::server
