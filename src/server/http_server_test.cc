// HttpServer over real sockets with httplib's client and a scripted FakeBackend: routes, SSE,
// stop strings, errors, auth, limits, 429/503, disconnects, timeouts and concurrency.
#include "server/http_server.h"

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "model/tokenizer_test_util.h"
#include "server/fake_backend.h"

namespace tandem::server {
namespace {

using nlohmann::json;
using serving::FinishReason;

constexpr const char* kReply = "Hello world! This is a fake reply, with naïve UTF-8: 東京.";

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = model::Tokenizer::Create(model::testing_util::SmolLm2Vocab());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tokenizer_ = std::move(*tok);
    auto tmpl = model::ChatTemplate::Parse(
        model::testing_util::SmolLm2VocabJson()["chat_template"].get<std::string>());
    ASSERT_TRUE(tmpl.ok());
    template_.emplace(std::move(*tmpl));
    reply_ids_ = tokenizer_->Encode(kReply, false, false);
  }

  void TearDown() override { StopServer(); }

  // Starts a backend emitting `script` (default: kReply then EOS) and a server on a free port.
  void StartServer(
      ServerOptions options = {}, std::chrono::microseconds step = std::chrono::microseconds(300),
      std::function<std::vector<int32_t>(const serving::GenerationRequest&)> script = nullptr) {
    if (!script) {
      script = [this](const serving::GenerationRequest&) {
        auto ids = reply_ids_;
        ids.push_back(tokenizer_->eos_id());
        return ids;
      };
    }
    backend_ = std::make_unique<testing::FakeBackend>(
        script, std::vector<int32_t>{tokenizer_->eos_id()}, step);
    options.host = "127.0.0.1";
    options.port = 0;
    options.served_model_name = "smol";
    options.status_interval_s = 0.2;
    if (options.max_model_len == 2048) options.max_model_len = 512;
    server_ = std::make_unique<HttpServer>(options, ModelInfo{tokenizer_.get(), &*template_, ""},
                                           backend_.get());
    ASSERT_TRUE(server_->Bind().ok());
    thread_ = std::thread([this] { server_->Run(); });
  }

  void StopServer() {
    if (backend_) backend_->Drain(serving::Clock::now() + std::chrono::seconds(5));
    if (server_) server_->Stop();
    if (thread_.joinable()) thread_.join();
    server_.reset();
    backend_.reset();
  }

  httplib::Client Client() {
    httplib::Client c("127.0.0.1", server_->port());
    c.set_read_timeout(20, 0);
    return c;
  }

  httplib::Result Post(const std::string& path, const std::string& body,
                       httplib::Headers headers = {}) {
    auto c = Client();
    return c.Post(path.c_str(), headers, body, "application/json");
  }

  // Streams `body` to `path`; returns the SSE `data:` payloads in order.
  std::vector<std::string> Stream(const std::string& path, const std::string& body, int* status) {
    auto c = Client();
    httplib::Request req;
    req.method = "POST";
    req.path = path;
    req.headers = {{"Content-Type", "application/json"}};
    req.body = body;
    std::string raw;
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      raw.append(data, n);
      return true;
    };
    const auto t0 = serving::Clock::now();
    auto res = c.send(req);
    *status = res ? res->status : -1;
    if (!res) {
      ADD_FAILURE() << "request failed: " << httplib::to_string(res.error()) << " after "
                    << std::chrono::duration<double>(serving::Clock::now() - t0).count()
                    << " s, got " << raw.size() << " bytes";
    }
    std::vector<std::string> events;
    size_t pos = 0;
    while (true) {
      const size_t end = raw.find("\n\n", pos);
      if (end == std::string::npos) break;
      const std::string ev = raw.substr(pos, end - pos);
      EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
      events.push_back(ev.substr(6));
      pos = end + 2;
    }
    EXPECT_EQ(pos, raw.size()) << "trailing bytes: " << raw.substr(pos);
    return events;
  }

  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::optional<model::ChatTemplate> template_;
  std::vector<int32_t> reply_ids_;
  std::unique_ptr<testing::FakeBackend> backend_;
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

const char* kChatBody = R"({"model":"smol","messages":[{"role":"user","content":"Say hello"}]})";

TEST_F(HttpServerTest, HealthModelsAndMetrics) {
  StartServer();
  auto c = Client();
  auto res = c.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(json::parse(res->body)["status"], "ok");
  res = c.Get("/v1/models");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["data"][0]["id"], "smol");
  res = c.Get("/metrics");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_NE(res->get_header_value("Content-Type").find("text/plain; version=0.0.4"),
            std::string::npos);
  EXPECT_NE(res->body.find("tandem_kv_blocks_free 1000\n"), std::string::npos);
}

TEST_F(HttpServerTest, ChatNonStreaming) {
  StartServer();
  auto res = Post("/v1/chat/completions", kChatBody);
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["id"].get<std::string>().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(j["choices"][0]["message"]["content"], kReply);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const auto prompt =
      tokenizer_->Encode(template_->Apply({{"user", "Say hello"}}, true).value(), false, true);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], reply_ids_.size() + 1);  // + EOS
  EXPECT_EQ(backend_->last_request().prompt_tokens, prompt);
  EXPECT_EQ(backend_->last_request().max_tokens, 512 - static_cast<int>(prompt.size()));
}

TEST_F(HttpServerTest, CompletionLengthAndSamplingParams) {
  StartServer();
  auto res = Post(
      "/v1/completions",
      R"({"prompt":"Once upon","max_tokens":3,"temperature":0.7,"top_k":5,"top_p":0.9,"seed":42})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json j = json::parse(res->body);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], tokenizer_->Decode({reply_ids_.data(), 3}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  const auto r = backend_->last_request();
  EXPECT_EQ(r.prompt_tokens, tokenizer_->Encode("Once upon", tokenizer_->add_bos(), false));
  EXPECT_EQ(r.sampling.top_k, 5);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.7f);
}

TEST_F(HttpServerTest, ChatStreamingWithUsage) {
  StartServer();
  int status = 0;
  auto events = Stream("/v1/chat/completions",
                       R"({"messages":[{"role":"user","content":"hi"}],"stream":true,
                           "stream_options":{"include_usage":true}})",
                       &status);
  EXPECT_EQ(status, 200);
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const json first = json::parse(events[0]);
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  std::string finish;
  for (size_t i = 1; i + 2 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], first["id"]);
    const auto& c = e["choices"][0];
    if (c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
    if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
  }
  EXPECT_EQ(text, kReply);
  EXPECT_EQ(finish, "stop");
  const json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["completion_tokens"], reply_ids_.size() + 1);
}

TEST_F(HttpServerTest, CompletionStreamingStopStringIsNotEmitted) {
  StartServer();
  int status = 0;
  auto events =
      Stream("/v1/completions", R"({"prompt":"x","stream":true,"stop":["is a fake"]})", &status);
  EXPECT_EQ(status, 200);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text, finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "Hello world! This ");
  EXPECT_EQ(finish, "stop");
  // Non-streaming gives the same.
  auto res = Post("/v1/completions", R"({"prompt":"x","stop":"is a fake"})");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["choices"][0]["text"], "Hello world! This ");
}

TEST_F(HttpServerTest, BadRequestsGetOpenAiErrorsAndServerKeepsServing) {
  ServerOptions o;
  o.max_body_bytes = 1 << 20;
  StartServer(o);
  struct Case {
    std::string method, path, body;
    int status;
  };
  const std::vector<Case> cases = {
      {"POST", "/v1/chat/completions", "{not json", 400},
      {"POST", "/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}",
       400},
      {"POST", "/v1/chat/completions", R"({"messages":[]})", 400},
      {"POST", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"model":"nope"})", 404},
      {"POST", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"max_tokens":100000})", 400},
      {"POST", "/v1/chat/completions", R"({"messages":[{"role":"user","content":"hi"}],"n":30})",
       400},
      {"POST", "/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{"99999999":1}})", 400},
      {"POST", "/v1/completions",
       R"({"prompt":")" + std::string(3000, 'z') + " " + std::string(3000, 'q') + "\"}", 400},
      {"POST", "/v1/completions", R"({"max_tokens":5})", 400},
      {"POST", "/v1/completions", std::string(2 << 20, ' '), 413},
      {"GET", "/v1/chat/completions", "", 405},
      {"POST", "/v1/models", "{}", 405},
      {"GET", "/nope", "", 404},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.path + " " + c.body.substr(0, 80));
    auto cli = Client();
    auto res = c.method == "GET" ? cli.Get(c.path.c_str())
                                 : cli.Post(c.path.c_str(), c.body, "application/json");
    ASSERT_TRUE(res) << httplib::to_string(res.error());
    EXPECT_EQ(res->status, c.status);
    const json j = json::parse(res->body);
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_TRUE(j["error"].contains("type"));
    EXPECT_TRUE(j["error"].contains("param"));
    EXPECT_TRUE(j["error"].contains("code"));
  }
  // Headers beyond the limit (16 KiB): a 431 that says so, and the server goes on.
  {
    auto res = Post("/v1/chat/completions", kChatBody, {{"X-Big", std::string(20000, 'a')}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 431);
    EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find("header"),
              std::string::npos)
        << res->body;
  }
  auto res = Post("/v1/chat/completions", kChatBody);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_GE(server_->metrics().outcome_count(Outcome::kBadRequest), 10);
}

TEST_F(HttpServerTest, ApiKey) {
  ServerOptions o;
  o.api_key = "sekret";
  StartServer(o);
  auto res = Post("/v1/chat/completions", kChatBody);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "invalid_api_key");
  res = Post("/v1/chat/completions", kChatBody, {{"Authorization", "Bearer wrong"}});
  EXPECT_EQ(res->status, 401);
  res = Post("/v1/chat/completions", kChatBody, {{"Authorization", "Bearer sekre"}});
  EXPECT_EQ(res->status, 401);
  res = Post("/v1/chat/completions", kChatBody, {{"Authorization", "Bearer sekret"}});
  EXPECT_EQ(res->status, 200);
  auto c = Client();
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);
}

// Browsers preflight a cross-origin call without credentials: the preflight is answered
// before the API key is checked, and the answers (errors included) carry the origin's grant.
TEST_F(HttpServerTest, CorsPreflightWorksWithAnApiKey) {
  ServerOptions o;
  o.api_key = "sekret";
  o.allowed_origins = {"https://app.example"};
  StartServer(o);
  auto c = Client();
  const httplib::Headers preflight = {
      {"Origin", "https://app.example"},
      {"Access-Control-Request-Method", "POST"},
      {"Access-Control-Request-Headers", "authorization,content-type"}};
  auto res = c.Options("/v1/chat/completions", preflight);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 204);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Headers"), "authorization,content-type");
  EXPECT_NE(res->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);

  res = Post("/v1/chat/completions", kChatBody,
             {{"Origin", "https://app.example"}, {"Authorization", "Bearer sekret"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "https://app.example");
  res = Post("/v1/chat/completions", kChatBody, {{"Origin", "https://app.example"}});
  EXPECT_EQ(res->status, 401);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "https://app.example");

  // Another origin gets no grant (the browser then refuses the call), preflight or not.
  res = c.Options("/v1/chat/completions",
                  {{"Origin", "https://evil.example"}, {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(res);
  EXPECT_FALSE(res->has_header("Access-Control-Allow-Origin"));
  res = Post("/v1/chat/completions", kChatBody,
             {{"Origin", "https://evil.example"}, {"Authorization", "Bearer sekret"}});
  EXPECT_FALSE(res->has_header("Access-Control-Allow-Origin"));
}

TEST_F(HttpServerTest, CorsAnyOriginByDefault) {
  StartServer();
  auto res = Post("/v1/chat/completions", kChatBody, {{"Origin", "https://any.example"}});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Access-Control-Allow-Origin"), "https://any.example");
  EXPECT_EQ(res->get_header_value("Vary"), "Origin");
}

TEST_F(HttpServerTest, BackendRejectionsMapTo429And503) {
  StartServer();
  backend_->FailNextSubmit(ResourceExhausted("waiting queue full (256)"));
  auto res = Post("/v1/chat/completions", kChatBody);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_NE(json::parse(res->body)["error"]["message"].get<std::string>().find("queue full"),
            std::string::npos);
  backend_->FailNextSubmit(OutOfRange("needs more KV blocks than exist"));
  EXPECT_EQ(Post("/v1/chat/completions", kChatBody)->status, 400);
  backend_->FailNextSubmit(FailedPrecondition("draining"));
  EXPECT_EQ(Post("/v1/chat/completions", kChatBody)->status, 503);
  EXPECT_EQ(server_->metrics().outcome_count(Outcome::kRejected), 2);
}

TEST_F(HttpServerTest, ChoicesWaitingForTheirPromptHoldNoHandlerThread) {
  // Two handler threads and six n = 2 requests queued in a paused backend: the forks wait for
  // their prompt's first token without a thread, so the door still answers.
  ServerOptions options;
  options.http_threads = 2;
  StartServer(options);
  backend_->SetPaused(true);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      auto res = Post("/v1/completions", R"({"prompt":"x","n":2,"max_tokens":4})");
      ASSERT_TRUE(res);
      EXPECT_EQ(res->status, 200) << res->body;
      EXPECT_EQ(json::parse(res->body)["choices"].size(), 2u);
      ok.fetch_add(1);
    });
  }
  while (backend_->active() < 6) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(backend_->active(), 6);  // the first choices only
  auto health = Client().Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  backend_->SetPaused(false);
  for (auto& c : clients) c.join();
  EXPECT_EQ(ok.load(), 6);
  EXPECT_EQ(backend_->finished(FinishReason::kLength), 12);
}

TEST_F(HttpServerTest, AChoiceRefusedAfterItsPromptStartedEndsTheResponse) {
  StartServer();
  for (bool stream : {false, true}) {
    SCOPED_TRACE(stream);
    // The previous round's first choice (cancelled) has left the backend.
    while (backend_->active() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    backend_->SetPaused(true);
    int status = 0;
    std::vector<std::string> events;
    std::optional<httplib::Result> res;
    const std::string body = std::string(R"({"prompt":"x","n":2,"max_tokens":4,"stream":)") +
                             (stream ? "true}" : "false}");
    std::thread client([&] {
      if (stream) {
        events = Stream("/v1/completions", body, &status);
      } else {
        res.emplace(Post("/v1/completions", body));
      }
    });
    while (backend_->active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    backend_->FailNextSubmit(ResourceExhausted("waiting queue full (64)"));  // the second choice
    backend_->SetPaused(false);
    client.join();
    if (stream) {
      EXPECT_EQ(status, 200);
      ASSERT_GE(events.size(), 2u);
      EXPECT_EQ(events.back(), "[DONE]");
      const json err = json::parse(events[events.size() - 2]);
      EXPECT_EQ(err["error"]["type"], "rate_limit_error") << err.dump();
    } else {
      ASSERT_TRUE(*res);
      EXPECT_EQ((*res)->status, 429) << (*res)->body;
      EXPECT_NE((*res)->body.find("queue full"), std::string::npos);
    }
  }
  EXPECT_EQ(server_->metrics().outcome_count(Outcome::kRejected), 2);
}

TEST_F(HttpServerTest, DrainRejectsNewRequestsAndFinishesInFlight) {
  // 300 tokens at 2 ms: a request in flight for ~0.6 s.
  StartServer({}, std::chrono::milliseconds(2),
              [](const serving::GenerationRequest&) { return std::vector<int32_t>(300, 330); });
  std::thread client([&] {
    auto res = Post("/v1/completions", R"({"prompt":"x","max_tokens":300})");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 300);
  });
  while (backend_->active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  server_->BeginDrain();
  EXPECT_EQ(Post("/v1/completions", R"({"prompt":"x"})")->status, 503);
  EXPECT_EQ(Client().Get("/health")->status, 503);
  backend_->Drain(serving::Clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(server_->WaitIdle(serving::Clock::now() + std::chrono::seconds(10)));
  client.join();
  EXPECT_EQ(backend_->finished(FinishReason::kLength), 1);
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamCancels) {
  StartServer({}, std::chrono::milliseconds(1),
              [](const serving::GenerationRequest&) { return std::vector<int32_t>(100000, 330); });
  auto c = Client();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = R"({"prompt":"x","stream":true,"ignore_eos":true})";
  int chunks = 0;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 5; };
  auto res = c.send(req);
  EXPECT_FALSE(res);  // we aborted
  c.stop();
  const auto give_up = serving::Clock::now() + std::chrono::seconds(10);
  while (backend_->active() > 0 && serving::Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(backend_->active(), 0);
  EXPECT_EQ(backend_->finished(FinishReason::kCancelled), 1);
  EXPECT_TRUE(server_->WaitIdle(serving::Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(server_->metrics().outcome_count(Outcome::kCancelled), 1);
  EXPECT_EQ(Post("/v1/chat/completions", kChatBody)->status, 200);
}

TEST_F(HttpServerTest, AClientThatGivesUpOnAWholeAnswerCancelsIt) {
  // 400 tokens at 5 ms: 2 s of work.
  StartServer({}, std::chrono::milliseconds(5),
              [](const serving::GenerationRequest&) { return std::vector<int32_t>(100000, 330); });
  {
    auto c = Client();
    c.set_read_timeout(0, 300000);  // gives up after 0.3 s and closes its connection
    auto res = c.Post("/v1/completions", R"({"prompt":"x","max_tokens":400,"ignore_eos":true})",
                      "application/json");
    EXPECT_FALSE(res);
    c.stop();
  }
  const auto give_up = serving::Clock::now() + std::chrono::seconds(10);
  while (backend_->active() > 0 && serving::Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(backend_->active(), 0);
  EXPECT_EQ(backend_->finished(FinishReason::kCancelled), 1);
  EXPECT_TRUE(server_->WaitIdle(serving::Clock::now() + std::chrono::seconds(10)));
  EXPECT_EQ(server_->metrics().outcome_count(Outcome::kCancelled), 1);
  EXPECT_EQ(Post("/v1/chat/completions", kChatBody)->status, 200);
}

TEST_F(HttpServerTest, RequestTimeout) {
  ServerOptions o;
  o.request_timeout_s = 0.3;
  StartServer(o, std::chrono::milliseconds(5),
              [](const serving::GenerationRequest&) { return std::vector<int32_t>(100000, 330); });
  auto res = Post("/v1/completions", R"({"prompt":"x","max_tokens":400})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 504);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "timeout");
  int status = 0;
  auto events =
      Stream("/v1/completions", R"({"prompt":"x","max_tokens":400,"stream":true})", &status);
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  EXPECT_TRUE(json::parse(events[events.size() - 2]).contains("error"));
  EXPECT_EQ(server_->metrics().outcome_count(Outcome::kTimeout), 2);
}

std::string Words(int n) {
  std::string s = "word";
  for (int i = 1; i < n; ++i) s += " word";
  return s;
}

TEST_F(HttpServerTest, ConcurrentStreamsEachGetTheirText) {
  StartServer({}, std::chrono::microseconds(200), [this](const serving::GenerationRequest& r) {
    // The reply depends on the prompt, so that mixing streams up would show.
    auto ids = tokenizer_->Encode("reply to " + std::to_string(r.prompt_tokens.size()) + " tokens",
                                  false, false);
    ids.push_back(tokenizer_->eos_id());
    return ids;
  });
  constexpr int kClients = 32;
  std::vector<std::string> texts(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      int status = 0;
      auto events = Stream("/v1/completions",
                           R"({"prompt":")" + Words(i + 1) + R"(","stream":true})", &status);
      EXPECT_EQ(status, 200) << i;
      for (size_t k = 0; k + 1 < events.size(); ++k) {
        texts[i] += json::parse(events[k])["choices"][0]["text"].get<std::string>();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kClients; ++i) {
    const auto prompt = tokenizer_->Encode(Words(i + 1), tokenizer_->add_bos(), false);
    EXPECT_EQ(texts[i], "reply to " + std::to_string(prompt.size()) + " tokens") << i;
  }
}

}  // namespace
}  // namespace tandem::server
