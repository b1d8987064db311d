// The token-level constraint with the real SmolLM2 vocabulary: Restrict (one pass over the
// vocabulary) agrees with Allows token by token, and greedy decoding of a fixed token preference
// under the constraint yields a document the schema accepts.
#include "structured/token_constraint.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/tokenizer_test_util.h"
#include "structured/json_matcher.h"
#include "structured/tool_call.h"

namespace tandem::structured {
namespace {

class TokenConstraintTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = model::Tokenizer::Create(model::testing_util::SmolLm2Vocab());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = std::move(*tok);
    table_ = TokenTable::FromTokenizer(*tokenizer_);
  }
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::shared_ptr<const TokenTable> table_;
};

TEST_F(TokenConstraintTest, RestrictAgreesWithAllowsAlongADocument) {
  auto schema = CompileSchema(R"({"type":"object","properties":{"name":{"type":"string"},
      "n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["name","n"],
      "additionalProperties":false})");
  ASSERT_TRUE(schema.ok());
  auto c = MakeJsonConstraint(*schema, table_);
  const std::vector<int32_t> doc =
      tokenizer_->Encode(R"({"name": "Ann", "n": 12, "ok": true})", false, false);
  const size_t vocab = table_->pieces.size();
  for (size_t step = 0; step <= doc.size(); ++step) {
    std::vector<float> weights(vocab, 1.0f);
    c->Restrict(weights);
    size_t allowed = 0;
    for (size_t t = 0; t < vocab; ++t) {
      ASSERT_EQ(weights[t] != 0, c->Allows(static_cast<int32_t>(t)))
          << "step " << step << " token " << t << " '" << table_->pieces[t] << "'";
      allowed += weights[t] != 0;
    }
    EXPECT_GT(allowed, 0u) << step;
    if (step == doc.size()) break;
    ASSERT_TRUE(c->Allows(doc[step])) << step << " '" << table_->pieces[doc[step]] << "'";
    c->Accept(doc[step]);
  }
  EXPECT_TRUE(c->Finished());
  EXPECT_TRUE(c->Allows(tokenizer_->eos_id()));
}

// Inside strings Restrict lets text tokens through without trying them (their bytes cannot end
// or break a string): the answers must still be the matcher's own, up to a maxLength.
TEST_F(TokenConstraintTest, TextTokensInsideStringsAreTheMatchersAnswers) {
  auto schema = CompileSchema(R"({"type":"object","properties":{
      "short":{"type":"string","maxLength":6},"free":{"type":"string"}},
      "required":["short","free"],"additionalProperties":false})");
  ASSERT_TRUE(schema.ok());
  auto c = MakeJsonConstraint(*schema, table_);
  JsonMatcher reference(*schema), scratch(*schema);
  const std::vector<int32_t> doc = tokenizer_->Encode(
      R"({"short": "abc de", "free": "a longer text, with \"quotes\" and é"})", false, false);
  const size_t vocab = table_->pieces.size();
  size_t shortcut_states = 0;
  for (size_t step = 0; step < doc.size(); ++step) {
    std::vector<float> weights(vocab, 1.0f);
    c->Restrict(weights);
    shortcut_states += reference.PlainStringRoom() > 0;
    for (size_t t = 0; t < vocab; ++t) {
      if (table_->end[t] || table_->control[t] || table_->pieces[t].empty()) continue;
      ASSERT_EQ(weights[t] != 0, reference.WouldAccept(table_->pieces[t], &scratch))
          << "step " << step << " token " << t << " '" << table_->pieces[t] << "'";
    }
    ASSERT_TRUE(c->Allows(doc[step])) << step << " '" << table_->pieces[doc[step]] << "'";
    c->Accept(doc[step]);
    ASSERT_TRUE(reference.FeedAll(table_->pieces[doc[step]]));
  }
  EXPECT_GT(shortcut_states, 4u);  // the shortcut was taken, in both strings
}

TEST_F(TokenConstraintTest, EndTokensOnlyOnceComplete) {
  auto c = MakeJsonConstraint(AnyObjectSchema(), table_);
  const int32_t eos = tokenizer_->eos_id();
  EXPECT_FALSE(c->Allows(eos));
  for (int32_t t : tokenizer_->Encode("{}", false, false)) c->Accept(t);
  EXPECT_TRUE(c->Allows(eos));
  EXPECT_TRUE(c->Finished());
  EXPECT_FALSE(c->Allows(tokenizer_->Encode("x", false, false)[0]));
}

// After a whole call, the answer may end or make another call up to the limit (a format with a
// closing part, Mistral's ']', must write it); once the last call is whole only the end remains.
TEST_F(TokenConstraintTest, CallsFollowCallsUpToTheLimit) {
  auto schema = CompileSchema(ToolCallSchema({{"f", R"({"type":"object","properties":{}})"}}));
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  const int32_t eos = tokenizer_->eos_id();
  const std::string hermes_call = R"(<tool_call>{"name":"f","arguments":{}}</tool_call>)";
  const std::string mistral_call = R"({"name":"f","arguments":{}})";
  struct Case {
    ToolFormat format;
    std::string first, more, last;  // after `first`: `more` is a second call; `last` ends
  };
  for (const Case& k :
       {Case{ToolFormat::kHermes, hermes_call, hermes_call, ""},
        Case{ToolFormat::kMistral, "[TOOL_CALLS][" + mistral_call, "," + mistral_call, "]"}}) {
    SCOPED_TRACE(std::string(ToolFormatName(k.format)));
    auto c = MakeToolCallConstraint(*schema, /*required=*/true, table_, /*max_calls=*/2, k.format);
    for (int32_t t : tokenizer_->Encode(k.first, false, false)) {
      ASSERT_TRUE(c->Allows(t));
      c->Accept(t);
    }
    EXPECT_FALSE(c->Finished());
    EXPECT_EQ(c->Allows(eos), k.last.empty());
    for (int32_t t : tokenizer_->Encode(k.more + k.last, false, false)) {
      ASSERT_TRUE(c->Allows(t));
      c->Accept(t);
    }
    EXPECT_TRUE(c->Finished());  // two calls: the limit
    EXPECT_TRUE(c->Allows(eos));
    auto one = MakeToolCallConstraint(*schema, /*required=*/true, table_, 1, k.format);
    for (int32_t t : tokenizer_->Encode(k.first + k.last, false, false)) one->Accept(t);
    EXPECT_TRUE(one->Finished());
  }
}

}  // namespace
}  // namespace tandem::structured
