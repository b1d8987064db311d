// ChatTemplate tests; expected renderings come from jinja2 (chat_template_golden.json, see
// tests/golden/tokenizer/README.md).
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include "model/tokenizer_test_util.h"

namespace tandem::model {
namespace {

// The SmolLM2-135M-Instruct template, verbatim from the GGUF metadata.
const char kSmolLm2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

TEST(ChatTemplateTest, LiteralMatchesGgufMetadata) {
  EXPECT_EQ(testing_util::SmolLm2VocabJson()["chat_template"].get<std::string>(), kSmolLm2Template);
}

TEST(ChatTemplateTest, SmolLm2MatchesJinja) {
  const nlohmann::json golden = testing_util::ReadGoldenJson("chat_template_golden.json");
  auto tmpl = ChatTemplate::Parse(golden["template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->kind(), ChatTemplate::Kind::kJinja);
  int n = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(tmpl->Apply(messages, c["add_generation_prompt"]).value(),
              c["expected"].get<std::string>())
        << c.dump();
    ++n;
  }
  EXPECT_EQ(n, 10);
}

TEST(ChatTemplateTest, SmolLm2Literal) {
  auto tmpl = ChatTemplate::Parse(kSmolLm2Template);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->Apply({{"user", "Hello!"}}, true).value(),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tmpl->Apply({{"system", "Be brief."}, {"user", "Hi"}}, false).value(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(tmpl->Apply({}, true).value(), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, PlainChatMLHasNoDefaultSystem) {
  auto tmpl = ChatTemplate::Parse(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->Apply({{"user", "x"}}, false).value(), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, EscapedNewlinesInDefaultSystem) {
  // Some converters keep the Jinja escape "\n" instead of a real newline.
  auto tmpl = ChatTemplate::Parse(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
      "{% endfor %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->Apply({{"user", "x"}}, false).value(),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nx<|im_end|>\n");
}

// Gemma 3's turn format (what its instruction-tuned models' template renders): the system
// message joins the first user turn, "assistant" is "model", contents are trimmed.
TEST(ChatTemplateTest, GemmaFormat) {
  const ChatTemplate t = ChatTemplate::Gemma();
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief. "}, {"user", " Hi!\n"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(t.Apply(messages, true).value(),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(t.Apply({{"user", "x"}}, false).value(), "<start_of_turn>user\nx<end_of_turn>\n");
}

TEST(ChatTemplateTest, RefusesBadSyntaxAndReportsTemplateErrors) {
  auto bad = ChatTemplate::Parse("{% for m in messages %}{{ m.content }}");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 1"), std::string::npos) << bad.status().message();
  EXPECT_EQ(ChatTemplate::Parse("").status().code(), StatusCode::kInvalidArgument);

  auto strict = ChatTemplate::Parse(
      "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first turn must be the user') }}"
      "{% endif %}{{ messages[0]['content'] }}");
  ASSERT_TRUE(strict.ok());
  auto refused = strict->Apply({{"assistant", "x"}}, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("first turn must be the user"), std::string::npos);
}

// A template that writes bos_token first gets one BOS, not two, when the tokenizer adds its own.
TEST(ChatTemplateTest, LeadingBosIsTheTokenizers) {
  const std::string text = "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}";
  EXPECT_EQ(ChatTemplate::Parse(text, "<s>", "</s>", false)->Apply({{"user", "a"}}, true).value(),
            "<s>[a]</s>");
  EXPECT_EQ(ChatTemplate::Parse(text, "<s>", "</s>", true)->Apply({{"user", "a"}}, true).value(),
            "[a]</s>");
}

// Tools, calls and tool results reach a template that renders them itself.
TEST(ChatTemplateTest, ToolsReachTemplatesThatReadThem) {
  auto t = ChatTemplate::Parse(
      "{% for tool in tools %}<{{ tool.function.name }}>{% endfor %}"
      "{% for m in messages %}{{ m.role }}:{{ m.content }}"
      "{% for c in m.tool_calls %}{{ c.function.name }}{{ c.function.arguments | tojson }}"
      "{{ c.id }}{% endfor %}{{ m.tool_call_id }};{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_TRUE(t->reads_tools());
  std::vector<ChatMessage> messages = {
      {"user", "weather?"},
      {"assistant", "", {{"call_1", "get", R"({"z": 1, "a": "b"})"}}},
      {"tool", "sunny", {}, "call_1"}};
  EXPECT_EQ(
      t->Apply(messages, false, R"([{"type": "function", "function": {"name": "get"}}])").value(),
      R"(<get>user:weather?;assistant:get{"z": 1, "a": "b"}call_1;tool:sunnycall_1;)");
  EXPECT_FALSE(ChatTemplate::Parse("{{ messages }}")->reads_tools());
  EXPECT_FALSE(ChatTemplate::Gemma().reads_tools());
}

}  // namespace
}  // namespace tandem::model
