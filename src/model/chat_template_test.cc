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
  auto tmpl = ChatTemplate::Detect(golden["template"].get<std::string>());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->kind(), ChatTemplate::Kind::kChatML);
  int n = 0;
  for (const nlohmann::json& c : golden["cases"]) {
    std::vector<ChatMessage> messages;
    for (const nlohmann::json& m : c["messages"]) messages.push_back({m["role"], m["content"]});
    EXPECT_EQ(tmpl->Apply(messages, c["add_generation_prompt"]), c["expected"].get<std::string>())
        << c.dump();
    ++n;
  }
  EXPECT_EQ(n, 10);
}

TEST(ChatTemplateTest, SmolLm2Literal) {
  auto tmpl = ChatTemplate::Detect(kSmolLm2Template);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->Apply({{"user", "Hello!"}}, true),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tmpl->Apply({{"system", "Be brief."}, {"user", "Hi"}}, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(tmpl->Apply({}, true), "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, PlainChatMLHasNoDefaultSystem) {
  auto tmpl = ChatTemplate::Detect(
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->Apply({{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
}

TEST(ChatTemplateTest, EscapedNewlinesInDefaultSystem) {
  // Some converters keep the Jinja escape "\n" instead of a real newline.
  auto tmpl = ChatTemplate::Detect(
      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
      "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
      "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n'}}"
      "{% endfor %}");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status().ToString();
  EXPECT_EQ(tmpl->Apply({{"user", "x"}}, false),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nx<|im_end|>\n");
}

// Gemma 3's turn format (what its instruction-tuned models' template renders): the system
// message joins the first user turn, "assistant" is "model", contents are trimmed.
TEST(ChatTemplateTest, GemmaFormat) {
  const ChatTemplate t = ChatTemplate::Gemma();
  const std::vector<ChatMessage> messages = {
      {"system", "Be brief. "}, {"user", " Hi!\n"}, {"assistant", "Hello."}, {"user", "Bye"}};
  EXPECT_EQ(t.Apply(messages, true),
            "<start_of_turn>user\nBe brief.\n\nHi!<end_of_turn>\n"
            "<start_of_turn>model\nHello.<end_of_turn>\n"
            "<start_of_turn>user\nBye<end_of_turn>\n"
            "<start_of_turn>model\n");
  EXPECT_EQ(t.Apply({{"user", "x"}}, false), "<start_of_turn>user\nx<end_of_turn>\n");
}

TEST(ChatTemplateTest, RefusesUnknownTemplates) {
  const std::string llama2 =
      "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
      "{{ bos_token + '[INST] ' }}{% endif %}";
  auto r = ChatTemplate::Detect(llama2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(llama2.substr(0, 50)), std::string::npos)
      << r.status().message();
  EXPECT_EQ(ChatTemplate::Detect("").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::model
