// Request parsing and validation: good requests give the expected struct, bad ones a specific
// 4xx status, a message naming the problem and (where there is one) the parameter.
#include "server/openai_request.h"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "model/tokenizer_test_util.h"

namespace tandem::server {
namespace {

ProtocolLimits Limits() {
  ProtocolLimits limits;
  limits.served_model_name = "smol";
  limits.max_model_len = 100;
  return limits;
}

struct BadCase {
  Endpoint endpoint;
  std::string body;
  int status;
  std::string message_part;  // a substring the message must contain
  std::string param;         // expected "param" (empty: null)
};

constexpr Endpoint kChat = Endpoint::kChatCompletions;
constexpr Endpoint kCmpl = Endpoint::kCompletions;

std::string Chat(const std::string& extra) {
  return R"({"messages":[{"role":"user","content":"hi"}])" + extra + "}";
}
std::string Cmpl(const std::string& extra) { return R"({"prompt":"hi")" + extra + "}"; }

const std::vector<BadCase>& BadCases() {
  static const std::vector<BadCase> cases = {
      {kChat, "", 400, "not valid JSON", ""},
      {kChat, "{", 400, "not valid JSON", ""},
      {kChat, "{\"messages\": [}", 400, "not valid JSON", ""},
      {kChat, "nul", 400, "not valid JSON", ""},
      {kChat, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}", 400,
       "not valid JSON", ""},
      {kChat, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", 400, "not valid JSON",
       ""},
      {kChat, "[1,2,3]", 400, "must be a JSON object", ""},
      {kChat, "\"text\"", 400, "must be a JSON object", ""},
      {kChat, "{}", 400, "'messages' is required", "messages"},
      {kChat, R"({"messages":null})", 400, "'messages' is required", "messages"},
      {kChat, R"({"messages":"hi"})", 400, "'messages' must be an array", "messages"},
      {kChat, R"({"messages":[]})", 400, "must not be empty", "messages"},
      {kChat, R"({"messages":[5]})", 400, "'messages[0]' must be an object", "messages[0]"},
      {kChat, R"({"messages":[{"content":"hi"}]})", 400, "'messages[0].role' is required",
       "messages[0].role"},
      {kChat, R"({"messages":[{"role":7,"content":"hi"}]})", 400, "must be a string",
       "messages[0].role"},
      {kChat, R"({"messages":[{"role":"wizard","content":"hi"}]})", 400, "must be one of",
       "messages[0].role"},
      {kChat, R"({"messages":[{"role":"robot","content":"hi"}]})", 400, "must be one of",
       "messages[0].role"},
      {kChat, R"({"messages":[{"role":"user"}]})", 400, "'messages[0].content' is required",
       "messages[0].content"},
      {kChat, R"({"messages":[{"role":"user","content":42}]})", 400, "must be a string or an array",
       "messages[0].content"},
      {kChat,
       R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})",
       400, "not supported", "messages[0].content[0].type"},
      {kChat, R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})", 400,
       "must be a string", "messages[0].content[0].text"},
      {kChat, R"({"messages":[{"role":"user","content":["hi"]}]})", 400, "must be an object",
       "messages[0].content[0]"},
      {kChat, Chat(R"(,"model":"gpt-4")"), 404, "does not exist", "model"},
      {kChat, Chat(R"(,"model":5)"), 400, "'model' must be a string", "model"},
      {kChat, Chat(R"(,"max_tokens":0)"), 400, "'max_tokens' must be between 1 and 100",
       "max_tokens"},
      {kChat, Chat(R"(,"max_tokens":-5)"), 400, "'max_tokens' must be between", "max_tokens"},
      {kChat, Chat(R"(,"max_tokens":1000000000000)"), 400, "'max_tokens' must be between",
       "max_tokens"},
      {kChat, Chat(R"(,"max_tokens":99999999999999999999999)"), 400,
       "'max_tokens' must be an integer", "max_tokens"},
      {kChat, Chat(R"(,"max_tokens":"10")"), 400, "'max_tokens' must be an integer, got a string",
       "max_tokens"},
      {kChat, Chat(R"(,"max_tokens":1.5)"), 400, "'max_tokens' must be an integer", "max_tokens"},
      {kChat, Chat(R"(,"max_completion_tokens":101)"), 400, "between 1 and 100",
       "max_completion_tokens"},
      {kChat, Chat(R"(,"temperature":-0.1)"), 400, "'temperature' must be between 0 and 2",
       "temperature"},
      {kChat, Chat(R"(,"temperature":3)"), 400, "'temperature' must be between 0 and 2",
       "temperature"},
      {kChat, Chat(R"(,"temperature":"hot")"), 400, "'temperature' must be a number",
       "temperature"},
      {kChat, Chat(R"(,"temperature":true)"), 400, "got a boolean", "temperature"},
      {kChat, Chat(R"(,"top_p":0)"), 400, "'top_p' must be greater than 0", "top_p"},
      {kChat, Chat(R"(,"top_p":1.5)"), 400, "'top_p' must be between", "top_p"},
      {kChat, Chat(R"(,"top_k":-2)"), 400, "'top_k' must be between", "top_k"},
      {kChat, Chat(R"(,"min_p":2)"), 400, "'min_p' must be between", "min_p"},
      {kChat, Chat(R"(,"seed":"abc")"), 400, "'seed' must be an integer", "seed"},
      {kChat, Chat(R"(,"n":17)"), 400, "'n' must be between 1 and 16", "n"},
      {kChat, Chat(R"(,"n":0)"), 400, "'n' must be between 1", "n"},
      {kChat, Chat(R"(,"stop":5)"), 400, "'stop' must be a string or an array of strings", "stop"},
      {kChat, Chat(R"(,"stop":["a","b","c","d","e"])"), 400, "at most 4", "stop"},
      {kChat, Chat(R"(,"stop":["a",1])"), 400, "'stop' must be a string", "stop"},
      {kChat, Chat(R"(,"stream":"yes")"), 400, "'stream' must be a boolean", "stream"},
      {kChat, Chat(R"(,"stream_options":{"include_usage":true})"), 400,
       "only allowed when 'stream' is true", "stream_options"},
      {kChat, Chat(R"(,"stream":true,"stream_options":{"include_usage":1})"), 400,
       "must be a boolean", "stream_options.include_usage"},
      {kChat, Chat(R"(,"stream":true,"stream_options":[])"), 400, "must be an object",
       "stream_options"},
      {kChat, Chat(R"(,"logprobs":1)"), 400, "'logprobs' must be a boolean", "logprobs"},
      {kChat, Chat(R"(,"top_logprobs":2)"), 400, "needs 'logprobs'", "top_logprobs"},
      {kChat, Chat(R"(,"logprobs":true,"top_logprobs":21)"), 400, "between 0 and 20",
       "top_logprobs"},
      {kChat, Chat(R"(,"repetition_penalty":0)"), 400, "greater than 0", "repetition_penalty"},
      {kChat, Chat(R"(,"logit_bias":{"x":1})"), 400, "keys must be token ids", "logit_bias"},
      {kChat, Chat(R"(,"logit_bias":{"5":101})"), 400, "between -100 and 100", "logit_bias"},
      {kChat, Chat(R"(,"logit_bias":[1])"), 400, "'logit_bias' must be an object", "logit_bias"},
      {kChat, Chat(R"(,"min_tokens":-1)"), 400, "'min_tokens' must be between", "min_tokens"},
      {kChat, Chat(R"(,"stop_token_ids":[-1])"), 400, "non-negative integers", "stop_token_ids"},
      {kChat, Chat(R"(,"frequency_penalty":5)"), 400, "between -2 and 2", "frequency_penalty"},
      {kChat, Chat(R"(,"tools":[{"type":"function"}])"), 400, "must be an object",
       "tools[0].function"},
      {kChat, Chat(R"(,"tool_choice":"required")"), 400, "needs 'tools'", "tool_choice"},
      {kChat, R"({"messages":[{"role":"user","content":"x","tool_calls":[]}]})", 400,
       "for assistant messages", "messages[0].tool_calls"},
      {kChat, Chat(R"(,"response_format":{"type":"yaml"})"), 400, "must be text, json_object",
       "response_format.type"},
      {kChat, Chat(R"(,"response_format":{"type":"json_schema"})"), 400, "must be an object",
       "response_format.json_schema"},
      {kChat,
       Chat(
           R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string","pattern":"a+"}}})"),
       400, "'pattern'", "response_format.json_schema.schema"},
      {kChat, Chat(R"(,"ignore_eos":"no")"), 400, "'ignore_eos' must be a boolean", "ignore_eos"},
      {kChat, Chat(R"(,"user":1)"), 400, "'user' must be a string", "user"},
      {kCmpl, "{}", 400, "'prompt' is required", "prompt"},
      {kCmpl, R"({"prompt":5})", 400, "'prompt' must be a string", "prompt"},
      {kCmpl, R"({"prompt":[]})", 400, "must not be empty", "prompt"},
      {kCmpl, R"({"prompt":[[]]})", 400, "must not be empty", "prompt"},
      {kCmpl, R"({"prompt":["a",5]})", 400, "'prompt' must be", "prompt"},
      {kCmpl, R"({"prompt":["a",[]]})", 400, "must not be empty", "prompt"},
      {kCmpl, R"({"prompt":["a","b","c","d","e"],"n":16})", 400, "at most 64", "n"},
      {kCmpl, R"({"prompt":[1,-2]})", 400, "non-negative integers", "prompt"},
      {kCmpl, R"({"prompt":[1,"x"]})", 400, "non-negative integers", "prompt"},
      {kCmpl, R"({"prompt":[1.5]})", 400, "non-negative integers", "prompt"},
      {kCmpl, R"({"prompt":[{"a":1}]})", 400, "'prompt' must be", "prompt"},
      {kCmpl, Cmpl(R"(,"echo":1)"), 400, "'echo' must be a boolean", "echo"},
      {kCmpl, Cmpl(R"(,"best_of":3)"), 400, "best_of other than n", "best_of"},
      {kCmpl, Cmpl(R"(,"logprobs":21)"), 400, "between 0 and 20", "logprobs"},
      {kCmpl, Cmpl(R"(,"logprobs":true)"), 400, "'logprobs' must be an integer", "logprobs"},
      {kCmpl, Cmpl(R"(,"suffix":"end")"), 400, "not supported", "suffix"},
      {kCmpl, Cmpl(R"(,"model":"other")"), 404, "does not exist", "model"},
  };
  return cases;
}

TEST(OpenAiRequestTest, BadInputsGiveSpecificErrors) {
  ASSERT_GE(BadCases().size(), 30u);
  for (const BadCase& c : BadCases()) {
    SCOPED_TRACE(c.body);
    ParsedRequest out;
    const std::optional<ApiError> e = ParseRequest(c.endpoint, c.body, Limits(), &out);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->status, c.status);
    EXPECT_NE(e->message.find(c.message_part), std::string::npos) << e->message;
    EXPECT_EQ(e->param, c.param);
    if (c.status == 404) {
      EXPECT_EQ(e->code, "model_not_found");
    }
  }
}

TEST(OpenAiRequestTest, ParsesChatRequest) {
  ParsedRequest r;
  const std::string body = R"({
    "model": "smol", "stream": true, "stream_options": {"include_usage": true},
    "messages": [{"role": "developer", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                 {"role": "assistant", "content": null}],
    "max_completion_tokens": 7, "max_tokens": 9, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
    "min_p": 0.05, "seed": 123, "stop": ["x", ""], "n": 1, "ignore_eos": true,
    "presence_penalty": 0, "logprobs": false, "some_future_field": {"x": 1}})";
  ASSERT_FALSE(ParseRequest(kChat, body, Limits(), &r).has_value());
  EXPECT_EQ(r.model, "smol");
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "a\nb");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 7);  // max_completion_tokens wins
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.seed, 123u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(OpenAiRequestTest, DefaultsAndMissingModel) {
  ParsedRequest r;
  ASSERT_FALSE(
      ParseRequest(kCmpl, R"({"prompt":"hello","max_tokens":null,"top_k":-1})", Limits(), &r));
  EXPECT_EQ(r.model, "smol");
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "hello");
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_k, 0);
  EXPECT_FALSE(r.stream);
}

TEST(OpenAiRequestTest, PromptForms) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":["one string"]})", Limits(), &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].text, "one string");
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":[1,2,3]})", Limits(), &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{1, 2, 3}));
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":[[4,5]]})", Limits(), &r));
  EXPECT_EQ(r.prompts[0].token_ids, (std::vector<int32_t>{4, 5}));
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":["a",[6],"b"]})", Limits(), &r));
  ASSERT_EQ(r.prompts.size(), 3u);
  EXPECT_EQ(r.prompts[0].text, "a");
  EXPECT_EQ(r.prompts[1].token_ids, (std::vector<int32_t>{6}));
  EXPECT_EQ(r.prompts[2].text, "b");
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x","seed":-1})", Limits(), &r));
  EXPECT_EQ(r.sampling.seed, ~uint64_t{0});
  EXPECT_TRUE(r.seeded);
}

TEST(OpenAiRequestTest, UnseededRequestsGetDifferentSeeds) {
  ParsedRequest a, b;
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x"})", Limits(), &a));
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x"})", Limits(), &b));
  EXPECT_FALSE(a.seeded);
  EXPECT_NE(a.sampling.seed, b.sampling.seed);
}

TEST(OpenAiRequestTest, OutputControlsAreParsed) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kChat,
                            R"({"messages":[{"role":"user","content":"hi"}],
                                "presence_penalty":0.5,"frequency_penalty":-1,
                                "repetition_penalty":1.2,"logit_bias":{"7":-100,"12":2.5},
                                "min_tokens":3,"stop_token_ids":[4,9],"n":3,
                                "logprobs":true,"top_logprobs":5})",
                            Limits(), &r));
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -1.0f);
  EXPECT_FLOAT_EQ(r.sampling.repetition_penalty, 1.2f);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  std::map<int32_t, float> bias(r.sampling.logit_bias.begin(), r.sampling.logit_bias.end());
  EXPECT_FLOAT_EQ(bias.at(7), -100.0f);
  EXPECT_FLOAT_EQ(bias.at(12), 2.5f);
  EXPECT_EQ(r.sampling.min_tokens, 3);
  EXPECT_EQ(r.sampling.stop_token_ids, (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(r.n, 3);
  EXPECT_EQ(r.sampling.logprobs, 5);
  // Chat logprobs without top_logprobs: the chosen token only.
  ASSERT_FALSE(ParseRequest(kChat, R"({"messages":[{"role":"user","content":"hi"}],
                                       "logprobs":true})",
                            Limits(), &r));
  EXPECT_EQ(r.sampling.logprobs, 0);
  // Completions: an integer; echo.
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x","logprobs":2,"echo":true})", Limits(), &r));
  EXPECT_EQ(r.sampling.logprobs, 2);
  EXPECT_TRUE(r.echo);
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x","logprobs":false})", Limits(), &r));
  EXPECT_EQ(r.sampling.logprobs, -1);
}

TEST(OpenAiRequestTest, ModelAliasesAreAcceptedAndEchoed) {
  ProtocolLimits limits = Limits();
  limits.aliases = {"gpt-4o-mini"};
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x","model":"gpt-4o-mini"})", limits, &r));
  EXPECT_EQ(r.model, "gpt-4o-mini");
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"x"})", limits, &r));
  EXPECT_EQ(r.model, limits.served_model_name);
  EXPECT_EQ(ParseRequest(kCmpl, R"({"prompt":"x","model":"gpt-4"})", limits, &r)->status, 404);
}

TEST(OpenAiRequestTest, DeeplyNestedJsonIsRejectedWithoutCrashing) {
  ParsedRequest r;
  const std::string open(1 << 20, '[');
  EXPECT_EQ(ParseRequest(kChat, open, Limits(), &r)->status, 400);
  const std::string closed = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_EQ(ParseRequest(kChat, closed, Limits(), &r)->status, 400);
}

class BuildPromptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto vocab = model::testing_util::SmolLm2Vocab();
    ASSERT_FALSE(vocab.tokens.empty());
    auto tok = model::Tokenizer::Create(vocab);
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = std::move(*tok);
    auto tmpl = model::ChatTemplate::Parse(
        model::testing_util::SmolLm2VocabJson()["chat_template"].get<std::string>());
    ASSERT_TRUE(tmpl.ok());
    template_.emplace(std::move(*tmpl));
  }
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::optional<model::ChatTemplate> template_;
};

TEST_F(BuildPromptTest, ChatUsesTemplateWithSpecialTokens) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kChat, Chat(""), Limits(), &r));
  std::vector<int32_t> ids;
  int max_tokens = 0;
  ASSERT_FALSE(BuildPrompt(r, *tokenizer_, &*template_, "", 200, &ids, &max_tokens));
  const std::string expected = template_->Apply({{"user", "hi"}}, true).value();
  EXPECT_EQ(ids, tokenizer_->Encode(expected, tokenizer_->add_bos(), true));
  EXPECT_EQ(max_tokens, 200 - static_cast<int>(ids.size()));
}

TEST_F(BuildPromptTest, ChatWithoutTemplateIs400) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kChat, Chat(""), Limits(), &r));
  std::vector<int32_t> ids;
  int max_tokens = 0;
  auto e = BuildPrompt(r, *tokenizer_, nullptr, "unknown template", 200, &ids, &max_tokens);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_NE(e->message.find("no chat template"), std::string::npos);
  EXPECT_NE(e->message.find("unknown template"), std::string::npos);
}

TEST_F(BuildPromptTest, CompletionTextIsNotParsedForSpecialTokens) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"<|im_start|>x"})", Limits(), &r));
  std::vector<int32_t> ids;
  int max_tokens = 0;
  ASSERT_FALSE(BuildPrompt(r, *tokenizer_, &*template_, "", 200, &ids, &max_tokens));
  EXPECT_EQ(ids, tokenizer_->Encode("<|im_start|>x", tokenizer_->add_bos(), false));
}

TEST_F(BuildPromptTest, LengthErrorsNameBothLengths) {
  ParsedRequest r;
  const std::string long_prompt(400, 'a');
  ASSERT_FALSE(ParseRequest(
      kCmpl, R"({"prompt":")" + std::string(2000, 'x') + " " + long_prompt + "\"}", Limits(), &r));
  std::vector<int32_t> ids;
  int max_tokens = 0;
  auto e = BuildPrompt(r, *tokenizer_, &*template_, "", 50, &ids, &max_tokens);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_NE(e->message.find("maximum context length is 50 tokens"), std::string::npos)
      << e->message;
  EXPECT_NE(e->message.find("the prompt has " + std::to_string(ids.size()) + " tokens"),
            std::string::npos)
      << e->message;

  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":"Hello there","max_tokens":99})", Limits(), &r));
  e = BuildPrompt(r, *tokenizer_, &*template_, "", 100, &ids, &max_tokens);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_NE(e->message.find("you requested " + std::to_string(ids.size() + 99) + " tokens"),
            std::string::npos)
      << e->message;
}

TEST_F(BuildPromptTest, TokenIdsAreChecked) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":[1, 999999]})", Limits(), &r));
  std::vector<int32_t> ids;
  int max_tokens = 0;
  auto e = BuildPrompt(r, *tokenizer_, &*template_, "", 100, &ids, &max_tokens);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("outside the vocabulary"), std::string::npos);
}

TEST_F(BuildPromptTest, EmptyPromptIs400) {
  ParsedRequest r;
  ASSERT_FALSE(ParseRequest(kCmpl, R"({"prompt":""})", Limits(), &r));
  std::vector<int32_t> ids;
  int max_tokens = 0;
  if (tokenizer_->add_bos()) GTEST_SKIP() << "BOS makes an empty prompt non-empty";
  auto e = BuildPrompt(r, *tokenizer_, &*template_, "", 100, &ids, &max_tokens);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("empty"), std::string::npos);
}

}  // namespace
}  // namespace tandem::server
