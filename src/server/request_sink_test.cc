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
      if (!sink.OnToken(id)) {
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
  EXPECT_TRUE(sink.OnToken(ids[0]));
  sink.MarkClientGone();
  EXPECT_TRUE(sink.client_gone());
  EXPECT_FALSE(sink.OnToken(ids[1]));
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
    for (int32_t id : ids) sink.OnToken(id);
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

}  // namespace
}  // namespace tandem::server
