#include "server/http_server.h"

#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <ctime>
#include <thread>

#include "common/http.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "server/choices.h"
#include "server/dashboard.h"
#include "server/http_util.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/request_sink.h"
#include "server/tokenize.h"

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;
using serving::FinishReason;

constexpr const char* kJson = "application/json";
// How long a streaming writer waits for output before checking on the connection again.
constexpr auto kStreamPoll = std::chrono::milliseconds(200);
// Extra time a non-streaming handler waits past the request deadline for the backend to report.
constexpr auto kDeadlineGrace = std::chrono::seconds(5);

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ApiErrorJson(e), kJson);
}

}  // namespace

class HttpServer::Impl {
 public:
  Impl(ServerOptions options, ModelInfo model, serving::GenerationBackend* backend)
      : options_(std::move(options)),
        model_(std::move(model)),
        backend_(backend),
        log_(GetLogger("server")),
        metrics_(std::make_shared<ServerMetrics>()),
        created_(static_cast<int64_t>(std::time(nullptr))) {
    limits_.served_model_name = options_.served_model_name;
    limits_.aliases = options_.model_aliases;
    limits_.max_model_len = options_.max_model_len;
    SetUpRoutes();
  }

  ~Impl() {
    Stop();
    if (status_thread_.joinable()) status_thread_.join();
  }

  Status Bind() {
    // A client that goes away mid-write must not kill the process.
    ::signal(SIGPIPE, SIG_IGN);
    HttpServerSettings settings;
    settings.threads = std::max(options_.http_threads, 4);
    settings.read_timeout_s = 30;
    settings.write_timeout_s = 30;
    // Longer than common clients' idle expiry (httpx: 5 s), so that a client never reuses a
    // connection the server is closing at that moment.
    settings.keep_alive_timeout_s = 10;
    settings.keep_alive_max_count = 1000;
    TANDEM_ASSIGN_OR_RETURN(
        port_, BindHttpServer(http_, options_.host, options_.port, settings, "the HTTP server"));
    return OkStatus();
  }

  bool Run() {
    if (options_.status_interval_s > 0) status_thread_ = std::thread([this] { StatusLoop(); });
    const bool ok = http_.listen_after_bind();
    SignalStatusStop();
    if (status_thread_.joinable()) status_thread_.join();
    return ok;
  }

  void Stop() {
    http_.stop();
    SignalStatusStop();
  }

  void BeginDrain() { draining_.store(true); }
  bool draining() const { return draining_.load(); }

  bool WaitIdle(Clock::time_point deadline) TANDEM_EXCLUDES(inflight_mu_) {
    MutexLock lock(&inflight_mu_);
    return inflight_cv_.WaitUntil(&inflight_mu_, deadline, [&] {
      inflight_mu_.AssertHeld();
      return inflight_ == 0;
    });
  }

  int port() const { return port_; }
  const ServerMetrics& metrics() const { return *metrics_; }

 private:
  // Counts a generation request from its handler's start until its response is done.
  class Inflight {
   public:
    explicit Inflight(Impl* impl) TANDEM_EXCLUDES(impl->inflight_mu_) : impl_(impl) {
      MutexLock lock(&impl_->inflight_mu_);
      ++impl_->inflight_;
    }
    ~Inflight() TANDEM_EXCLUDES(impl_->inflight_mu_) {
      MutexLock lock(&impl_->inflight_mu_);
      if (--impl_->inflight_ == 0) impl_->inflight_cv_.NotifyAll();
    }

   private:
    Impl* impl_;
  };

  void SetUpRoutes();
  void HandleGenerate(Endpoint endpoint, const httplib::Request& req, httplib::Response& res);
  void RespondWhole(ChoiceSet& choices, Clock::time_point deadline, httplib::Response& res);
  void RespondStream(std::shared_ptr<ChoiceSet> choices, std::shared_ptr<Inflight> inflight,
                     httplib::Response& res);
  httplib::Server::HandlerResponse PreRoute(const httplib::Request& req, httplib::Response& res);
  bool OriginAllowed(const std::string& origin) const;  // by options_.allowed_origins
  void StatusLoop() TANDEM_EXCLUDES(status_mu_);
  void SignalStatusStop() TANDEM_EXCLUDES(status_mu_);
  // status_thread_ is started and joined by Run() only.

  const ServerOptions options_;
  const ModelInfo model_;
  serving::GenerationBackend* const backend_;
  std::shared_ptr<spdlog::logger> log_;
  // Shared with sinks, whose finish hooks may run after a handler has returned.
  std::shared_ptr<ServerMetrics> metrics_;
  const int64_t created_;
  ProtocolLimits limits_;
  httplib::Server http_;
  int port_ = 0;
  std::atomic<bool> draining_{false};  // lock-free

  Mutex inflight_mu_;
  CondVar inflight_cv_;
  int inflight_ TANDEM_GUARDED_BY(inflight_mu_) = 0;

  Mutex status_mu_;
  CondVar status_cv_;
  bool status_stop_ TANDEM_GUARDED_BY(status_mu_) = false;
  std::thread status_thread_;
};

void HttpServer::Impl::SetUpRoutes() {
  http_.set_payload_max_length(options_.max_body_bytes);

  http_.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return PreRoute(req, res); });

  http_.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kChatCompletions, req, res);
  });
  http_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kCompletions, req, res);
  });
  // vLLM's tokenizer endpoints (server/tokenize.h).
  auto tokenizer_route = [this](bool tokenize) {
    return [this, tokenize](const httplib::Request& req, httplib::Response& res) {
      std::string body;
      const std::optional<ApiError> e =
          tokenize ? Tokenize(req.body, limits_, *model_.tokenizer, model_.chat_template,
                              model_.chat_template_error, &body)
                   : Detokenize(req.body, limits_, *model_.tokenizer, &body);
      if (e) {
        metrics_->CountOutcome(Outcome::kBadRequest);
        SendError(res, *e);
      } else {
        res.set_content(body, kJson);
      }
    };
  };
  http_.Post("/tokenize", tokenizer_route(true));
  http_.Post("/detokenize", tokenizer_route(false));
  http_.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    std::vector<std::string> names = {options_.served_model_name};
    names.insert(names.end(), options_.model_aliases.begin(), options_.model_aliases.end());
    res.set_content(ModelsBody(names, created_), kJson);
  });
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_.load()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", kJson);
    } else {
      res.set_content(R"({"status":"ok"})", kJson);
    }
  });
  http_.Get("/dashboard", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(DashboardPage(), "text/html; charset=utf-8");
  });
  http_.Get("/dashboard/data", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(DashboardJson(metrics_->Get(), backend_->Stats(), options_.served_model_name),
                    kJson);
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(backend_->Stats()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });

  // Errors httplib raises itself (unknown route, body too large, unreadable request) get an
  // OpenAI-shaped body; responses our handlers already filled are left alone.
  http_.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.status = res.status;
        const bool known = req.path == "/v1/chat/completions" || req.path == "/v1/completions" ||
                           req.path == "/v1/models" || req.path == "/health" ||
                           req.path == "/metrics" || req.path == "/tokenize" ||
                           req.path == "/detokenize" || req.path == "/dashboard" ||
                           req.path == "/dashboard/data";
        if (res.status == 404 && known) {
          e.status = 405;
          e.message = "method " + req.method + " is not allowed for " + req.path;
        } else if (res.status == 404) {
          e.message = "no route for " + req.method + " " + req.path;
          e.code = "not_found";
        } else if (res.status == 400) {
          // Our handlers fill their 400s; an empty one is httplib's: it could not read the
          // request line or headers (malformed, or a line beyond CPPHTTPLIB_HEADER_MAX_LENGTH,
          // 8 KiB in Debian's build).
          e.message =
              "the request could not be read: a malformed request line or headers, or a "
              "header line longer than 8192 bytes";
        } else if (res.status == 413) {
          e.message = "the request body is larger than the limit of " +
                      std::to_string(options_.max_body_bytes) + " bytes";
        } else {
          e.message = "the request could not be handled (HTTP " + std::to_string(res.status) + ")";
        }
        if (e.status == 413 || e.status == 400) metrics_->CountOutcome(Outcome::kBadRequest);
        SendError(res, e);
        return httplib::Server::HandlerResponse::Handled;
      }));
  http_.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          what = ex.what();
        } catch (...) {
        }
        log_->error("unhandled exception in a handler: {}", what);
        SendError(res, {500, "internal error: " + what, "server_error", "", ""});
      });
}

httplib::Server::HandlerResponse HttpServer::Impl::PreRoute(const httplib::Request& req,
                                                            httplib::Response& res) {
  // CORS: an allowed origin's requests carry its grant whatever the answer (errors too, so a
  // browser client can read them); a preflight is answered here, before the API key check,
  // since browsers never send credentials with one.
  const std::string origin = req.get_header_value("Origin");
  const bool origin_allowed = !origin.empty() && OriginAllowed(origin);
  if (origin_allowed) {
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
  }
  if (req.method == "OPTIONS") {
    res.status = 204;
    res.set_header("Allow", "GET, POST, OPTIONS");
    if (origin_allowed) {
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers",
                     asked.empty() ? "Authorization, Content-Type" : asked);
      res.set_header("Access-Control-Max-Age", "86400");
    }
    return httplib::Server::HandlerResponse::Handled;
  }
  const bool protected_path =
      req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
  if (!protected_path) return httplib::Server::HandlerResponse::Unhandled;
  if (!options_.api_key.empty()) {
    const std::string auth = req.get_header_value("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0 ||
        !ConstantTimeEquals(auth.substr(prefix.size()), options_.api_key)) {
      metrics_->CountOutcome(Outcome::kBadRequest);
      SendError(res, {401,
                      auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                   : "incorrect API key provided",
                      "invalid_request_error", "", "invalid_api_key"});
      return httplib::Server::HandlerResponse::Handled;
    }
  }
  if (draining_.load() && req.method == "POST") {
    metrics_->CountOutcome(Outcome::kRejected);
    SendError(res, {503, "the server is shutting down", "server_error", "", ""});
    return httplib::Server::HandlerResponse::Handled;
  }
  return httplib::Server::HandlerResponse::Unhandled;
}

bool HttpServer::Impl::OriginAllowed(const std::string& origin) const {
  for (const std::string& allowed : options_.allowed_origins) {
    if (allowed == "*" || allowed == origin) return true;
  }
  return false;
}

void HttpServer::Impl::HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                                      httplib::Response& res) {
  auto inflight = std::make_shared<Inflight>(this);
  const Clock::time_point arrival = Clock::now();
  ParsedRequest parsed;
  std::optional<ApiError> error = ParseRequest(endpoint, req.body, limits_, &parsed);
  // One prompt for chat; one or more for completions.
  const size_t n_prompts = endpoint == Endpoint::kChatCompletions ? 1 : parsed.prompts.size();
  std::vector<std::vector<int32_t>> prompts(error ? 0 : n_prompts);
  std::vector<int> max_tokens(prompts.size(), 0);
  for (size_t p = 0; p < prompts.size() && !error; ++p) {
    error = BuildPrompt(parsed, *model_.tokenizer, model_.chat_template, model_.chat_template_error,
                        options_.max_model_len, &prompts[p], &max_tokens[p], p);
  }
  if (!error) {
    if (Status st = parsed.sampling.ValidateTokens(model_.tokenizer->vocab_size()); !st.ok()) {
      error = ApiError::BadRequest(st.message());
    }
  }
  if (error) {
    metrics_->CountOutcome(Outcome::kBadRequest);
    log_->debug("rejected request ({}): {}", error->status, error->message);
    SendError(res, *error);
    return;
  }

  const std::string id = NewRequestId(endpoint);
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.request_timeout_s));
  const Clock::time_point deadline = arrival + timeout;
  const int total = static_cast<int>(prompts.size()) * parsed.n;
  auto doorbell = total > 1 ? std::make_shared<Doorbell>() : nullptr;
  std::vector<ChoiceRun> runs;
  runs.reserve(total);
  for (int index = 0; index < total; ++index) {
    const int p = index / parsed.n;
    ChoiceRun run;
    run.index = index;
    run.prompt = p;
    serving::GenerationRequest& g = run.request;
    g.id = total == 1 ? id : id + "-" + std::to_string(index);
    g.prompt_tokens = prompts[p];
    g.max_tokens = max_tokens[p];
    g.sampling = parsed.sampling;
    g.sampling.seed += static_cast<uint64_t>(index % parsed.n);
    g.ignore_eos = parsed.ignore_eos;
    g.slo_ttft_seconds = parsed.slo_ttft_ms / 1000.0;
    g.slo_tbt_seconds = parsed.slo_tbt_ms / 1000.0;
    g.arrival = arrival;
    g.deadline = deadline;
    if (parsed.echo) {
      const CompletionPrompt& cp = parsed.prompts[p];
      run.echo = cp.token_ids.empty() ? cp.text : model_.tokenizer->Decode(cp.token_ids);
    }
    auto on_finish = [metrics = metrics_, log = log_, id = g.id](const serving::FinishInfo& info) {
      metrics->CountOutcome(OutcomeOf(info.reason));
      metrics->RecordFinished(info);
      std::string breakdown;  // disaggregated requests: where the TTFT went
      if (info.prefill_seconds >= 0) {
        breakdown = fmt::format(" prefill={:.3f}s kv_transfer={:.4f}s first_decode={:.4f}s",
                                info.prefill_seconds, std::max(0.0, info.kv_transfer_seconds),
                                std::max(0.0, info.first_decode_seconds));
      }
      log->info(
          "{} finish={} prompt_tokens={} cached_tokens={} output_tokens={} queue={:.3f}s "
          "ttft={:.3f}s{} total={:.3f}s{}{}",
          id, serving::FinishReasonName(info.reason), info.prompt_tokens, info.cached_prompt_tokens,
          info.completion_tokens, info.queue_seconds, info.ttft_seconds, breakdown,
          info.total_seconds, info.message.empty() ? "" : " message=", info.message);
    };
    RequestSink::Extras extras{parsed.sampling.stop_token_ids, parsed.sampling.logprobs >= 0,
                               doorbell, g.prompt_tokens.front()};
    run.sink = std::make_shared<RequestSink>(model_.tokenizer, parsed.stop, parsed.ignore_eos,
                                             std::move(on_finish), std::move(extras));
    runs.push_back(std::move(run));
  }

  ResponseContext ctx{endpoint,
                      id,
                      static_cast<int64_t>(std::time(nullptr)),
                      parsed.model,
                      parsed.include_usage,
                      parsed.sampling.logprobs >= 0,
                      parsed.sampling.tool_mode != engine::SamplingParams::ToolMode::kNone};
  auto choices = std::make_shared<ChoiceSet>(ctx, std::move(runs), parsed.n, doorbell);
  const Status st = choices->Submit(backend_, deadline);
  if (!st.ok()) {
    Outcome outcome = Outcome::kError;
    const ApiError e = SubmitError(st, &outcome);
    metrics_->CountOutcome(outcome);
    log_->info("{} rejected: {}", id, st.ToString());
    if (e.status == 429) {
      res.set_header("Retry-After", std::to_string(std::max(1, backend_->RetryAfterSeconds())));
    }
    SendError(res, e);
    return;
  }
  if (parsed.stream) {
    RespondStream(std::move(choices), std::move(inflight), res);
  } else {
    RespondWhole(*choices, deadline, res);
  }
}

void HttpServer::Impl::RespondWhole(ChoiceSet& choices, Clock::time_point deadline,
                                    httplib::Response& res) {
  ChoiceSet::Whole whole =
      choices.CollectWhole(deadline + kDeadlineGrace, options_.request_timeout_s);
  if (whole.error) {
    choices.CancelAll();
    SendError(res, *whole.error);
  } else {
    res.set_content(whole.body, kJson);
  }
}

void HttpServer::Impl::RespondStream(std::shared_ptr<ChoiceSet> choices,
                                     std::shared_ptr<Inflight> inflight, httplib::Response& res) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct Writer {
    std::shared_ptr<ChoiceSet> choices;
    std::shared_ptr<Inflight> inflight;  // released when httplib drops the provider
    double timeout_s;
  };
  auto w = std::make_shared<Writer>(
      Writer{std::move(choices), std::move(inflight), options_.request_timeout_s});
  res.set_chunked_content_provider(
      "text/event-stream",
      [w](size_t /*offset*/, httplib::DataSink& out) {
        auto send = [&](const std::string& data) {
          if (out.write(data.data(), data.size())) return true;
          w->choices->CancelAll();
          return false;
        };
        bool finished = false;
        if (!w->choices->StreamStep(send, kStreamPoll, w->timeout_s, &finished)) return false;
        if (finished) out.done();
        return true;
      },
      [w](bool success) {
        if (!success) w->choices->CancelAll();
      });
}

void HttpServer::Impl::StatusLoop() {
  serving::BackendStats last = backend_->Stats();
  Clock::time_point last_time = Clock::now();
  const auto interval = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.status_interval_s));
  MutexLock lock(&status_mu_);
  while (!status_cv_.WaitFor(&status_mu_, interval, [&] {
    status_mu_.AssertHeld();
    return status_stop_;
  })) {
    const serving::BackendStats s = backend_->Stats();
    const Clock::time_point now = Clock::now();
    const bool changed = s.running != last.running || s.waiting != last.waiting ||
                         s.kv_blocks_used != last.kv_blocks_used ||
                         s.generated_tokens != last.generated_tokens;
    if (changed) {
      const double secs = std::chrono::duration<double>(now - last_time).count();
      const double tok_s = secs > 0 ? (s.generated_tokens - last.generated_tokens) / secs : 0.0;
      const double kv_pct =
          s.kv_blocks_total > 0 ? 100.0 * s.kv_blocks_used / s.kv_blocks_total : 0.0;
      log_->info(
          "status: running={} waiting={} kv_used={:.1f}% ({}/{} blocks) generation={:.1f} tok/s "
          "prefix_hit_tokens={}",
          s.running, s.waiting, kv_pct, s.kv_blocks_used, s.kv_blocks_total, tok_s,
          s.prefix_cache_hit_tokens);
    }
    last = s;
    last_time = now;
  }
}

void HttpServer::Impl::SignalStatusStop() {
  {
    MutexLock lock(&status_mu_);
    status_stop_ = true;
  }
  status_cv_.NotifyAll();
}

HttpServer::HttpServer(ServerOptions options, ModelInfo model, serving::GenerationBackend* backend)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(model), backend)) {}
HttpServer::~HttpServer() = default;
Status HttpServer::Bind() { return impl_->Bind(); }
int HttpServer::port() const { return impl_->port(); }
bool HttpServer::Run() { return impl_->Run(); }
void HttpServer::BeginDrain() { impl_->BeginDrain(); }
bool HttpServer::draining() const { return impl_->draining(); }
bool HttpServer::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  return impl_->WaitIdle(deadline);
}
void HttpServer::Stop() { impl_->Stop(); }
const ServerMetrics& HttpServer::metrics() const { return impl_->metrics(); }

}  // namespace tandem::server
