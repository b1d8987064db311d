// RequestSink with the real SmolLM2 tokenizer: detokenization across token boundaries, stop
// strings spanning tokens, end-of-generation handling and the producer/consumer hand-off.
#include "server/request_sink.h"

#include <gtest/gtest.h>

#include <thread>

#include "model/tokenizer_test_util.h"

namespace tandem::server {
namespace {

using serving::FinishInfo;
using serving::FinishReason;

class RequestSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = model::Tokenizer::Create(model::testing_util::SmolLm2Vocab());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = std::move(*tok);
  }
  std::vector<int32_t> Ids(const std::string& text) {
    return tokenizer_->Encode(text, false, false);
  }

  // Feeds `ids` (stopping when OnToken says so), finishes with `reason`, returns all text.
  std::string Drive(RequestSink& sink, const std::vector<int32_t>& ids, FinishReason reason,
                    FinishInfo* final_info, int* accepted) {
    *accepted = 0;
    FinishReason r = reason;
    for (int32_t id : ids) {
      ++*accepted;
      if (!sink.OnToken({id})) {
        r = FinishReason::kCancelled;
        break;
      }
    }
    FinishInfo info;
    info.reason = r;
    info.completion_tokens = *accepted;
    sink.OnFinish(info);
    std::string text;
    while (true) {
      auto t = sink.Wait(std::chrono::milliseconds(10));
      text += t.text;
      if (t.finished) {
        *final_info = t.info;
        return text;
      }
    }
  }

  std::unique_ptr<model::Tokenizer> tokenizer_;
};

TEST_F(RequestSinkTest, DecodesMultiByteCharactersSplitAcrossTokens) {
  const std::string text = "naïve café 東京 🙂 done";
  const auto ids = Ids(text);
  RequestSink sink(tokenizer_.get(), {}, false, nullptr);
  FinishInfo info;
  int accepted;
  EXPECT_EQ(Drive(sink, ids, FinishReason::kLength, &info, &accepted), text);
  EXPECT_EQ(info.reason, FinishReason::kLength);
  EXPECT_EQ(accepted, static_cast<int>(ids.size()));
}

TEST_F(RequestSinkTest, StopStringAcrossTokensIsNotEmittedAndCancels) {
  const auto ids = Ids("The answer is 42. Question: what else? More text here.");
  RequestSink sink(tokenizer_.get(), {"Question:"}, false, nullptr);
  FinishInfo info;
  int accepted;
  EXPECT_EQ(Drive(sink, ids, FinishReason::kLength, &info, &accepted), "The answer is 42. ");
  EXPECT_EQ(info.reason, FinishReason::kStop);  // the cancel it caused reports as stop
  EXPECT_LT(accepted, static_cast<int>(ids.size()));
}

TEST_F(RequestSinkTest, StopStringInsideOneToken) {
  const auto ids = Ids("hello world and more");
  RequestSink sink(tokenizer_.get(), {"orl"}, false, nullptr);
  FinishInfo info;
  int accepted;
  EXPECT_EQ(Drive(sink, ids, FinishReason::kLength, &info, &accepted), "hello w");
  EXPECT_EQ(info.reason, FinishReason::kStop);
}

TEST_F(RequestSinkTest, PartialStopAtTheEndIsEmitted) {
  const auto ids = Ids("abc Quest");
  RequestSink sink(tokenizer_.get(), {"Question"}, false, nullptr);
  FinishInfo info;
  int accepted;
  EXPECT_EQ(Drive(sink, ids, FinishReason::kLength, &info, &accepted), "abc Quest");
  EXPECT_EQ(info.reason, FinishReason::kLength);
}

TEST_F(RequestSinkTest, EndOfGenerationTokenIsNotText) {
  auto ids = Ids("Hi there");
  ids.push_back(tokenizer_->eos_id());
  RequestSink sink(tokenizer_.get(), {}, false, nullptr);
  FinishInfo info;
  int accepted;
  EXPECT_EQ(Drive(sink, ids, FinishReason::kStop, &info, &accepted), "Hi there");

  RequestSink keep(tokenizer_.get(), {}, /*ignore_eos=*/true, nullptr);
  const std::string with_eos = Drive(keep, ids, FinishReason::kLength, &info, &accepted);
  EXPECT_EQ(with_eos, "Hi there" + tokenizer_->TokenToPiece(tokenizer_->eos_id()));
}

TEST_F(RequestSinkTest, ClientGoneCancelsAtTheNextToken) {
  RequestSink sink(tokenizer_.get(), {}, false, nullptr);
  const auto ids = Ids("one two three");
  EXPECT_TRUE(sink.OnToken({ids[0]}));
  sink.MarkClientGone();
  EXPECT_TRUE(sink.client_gone());
  EXPECT_FALSE(sink.OnToken({ids[1]}));
}

TEST_F(RequestSinkTest, FinishHookSeesFinalReasonOnce) {
  int calls = 0;
  FinishReason seen = FinishReason::kError;
  RequestSink sink(tokenizer_.get(), {"two"}, false, [&](const FinishInfo& i) {
    ++calls;
    seen = i.reason;
  });
  FinishInfo info;
  int accepted;
  Drive(sink, Ids("one two three"), FinishReason::kLength, &info, &accepted);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, FinishReason::kStop);
}

TEST_F(RequestSinkTest, ConsumerOnAnotherThreadGetsEverything) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "word" + std::to_string(i) + " ";
  const auto ids = Ids(text);
  RequestSink sink(tokenizer_.get(), {}, false, nullptr);
  std::thread producer([&] {
    for (int32_t id : ids) sink.OnToken({id});
    FinishInfo info;
    info.reason = FinishReason::kLength;
    sink.OnFinish(info);
  });
  std::string got;
  while (true) {
    auto t = sink.Wait(std::chrono::milliseconds(50));
    got += t.text;
    if (t.finished) break;
  }
  producer.join();
  EXPECT_EQ(got, text);
}

TEST_F(RequestSinkTest, LogprobsAreHandedOutPerTokenAndStopTokensHideTheirText) {
  const auto ids = Ids("Hello world");
  ASSERT_GE(ids.size(), 2u);
  const int32_t stop_id = Ids(" stop")[0];
  auto doorbell = std::make_shared<Doorbell>();
  RequestSink sink(tokenizer_.get(), {}, false, nullptr, {{stop_id}, true, doorbell});
  const uint64_t rings = doorbell->rings();
  EXPECT_FALSE(sink.Started());
  ASSERT_TRUE(sink.OnToken({ids[0], -0.5f, {{ids[0], -0.5f}, {ids[1], -2.0f}}}));
  EXPECT_GT(doorbell->rings(), rings);
  EXPECT_TRUE(sink.Started());
  ASSERT_TRUE(sink.OnToken({ids[1], -0.25f, {}}));
  ASSERT_TRUE(sink.OnToken({stop_id, -1.0f, {}}));  // the backend ends the request after it
  sink.OnFinish({});
  std::string text;
  std::vector<TokenLogprobs> lps;
  while (true) {
    auto t = sink.Wait(std::chrono::milliseconds(10));
    text += t.text;
    for (auto& l : t.logprobs) lps.push_back(std::move(l));
    if (t.finished) break;
  }
  EXPECT_EQ(text, "Hello world");
  ASSERT_EQ(lps.size(), 3u);  // the stop token's logprob is reported, its text is not
  EXPECT_EQ(lps[0].piece + lps[1].piece, "Hello world");
  EXPECT_EQ(lps[0].top.size(), 2u);
  EXPECT_EQ(lps[0].top[1].first, tokenizer_->TokenToPiece(ids[1]));
  EXPECT_FLOAT_EQ(*lps[2].logprob, -1.0f);
  EXPECT_TRUE(sink.Started());
}

}  // namespace
}  // namespace tandem::server
