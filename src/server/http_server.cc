#include "server/http_server.h"

#include <signal.h>

#include <atomic>
#include <ctime>
#include <thread>

#include "common/logging.h"
#include "common/mutex.h"
#include "common/task_thread.h"
#include "http_door/door.h"
#include "server/choices.h"
#include "server/dashboard.h"
#include "server/http_util.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/openai_tools.h"
#include "server/request_sink.h"
#include "server/response_pump.h"
#include "server/tokenize.h"

namespace tandem::server {
namespace {

using Clock = std::chrono::steady_clock;
using serving::FinishReason;

constexpr const char* kJson = "application/json";
// Extra time a response waits past the request deadline for the backend to report.
constexpr auto kDeadlineGrace = std::chrono::seconds(5);

using http_door::Exchange;
using http_door::Request;
using http_door::Response;
using Headers = std::vector<std::pair<std::string, std::string>>;

Response ErrorResponse(const ApiError& e, Headers headers = {}) {
  return Response{e.status, kJson, ApiErrorJson(e), std::move(headers)};
}

Response JsonResponse(std::string body, Headers headers = {}) {
  return Response{200, kJson, std::move(body), std::move(headers)};
}

bool KnownPath(const std::string& path) {
  return path == "/v1/chat/completions" || path == "/v1/completions" || path == "/v1/models" ||
         path == "/health" || path == "/metrics" || path == "/tokenize" || path == "/detokenize" ||
         path == "/dashboard" || path == "/dashboard/data";
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
    limits_.tool_format = ToolFormatFor(model_.chat_template, options_.tool_call_format);
    http_door::DoorOptions door;
    door.host = options_.host;
    door.port = options_.port;
    door.handler_threads = std::max(options_.http_threads, 2);
    door.max_body_bytes = options_.max_body_bytes;
    door.max_header_bytes = options_.max_header_bytes;
    door.max_connections = options_.max_connections;
    door.request_timeout_s = 30;
    door.write_timeout_s = 30;
    // Longer than common clients' idle expiry (httpx: 5 s), so that a client never reuses a
    // connection the server is closing at that moment.
    door.idle_timeout_s = 10;
    door.error_response = [metrics = metrics_](int status, const std::string& reason) {
      metrics->CountOutcome(Outcome::kBadRequest);
      return ErrorResponse({status, reason, "invalid_request_error", "", ""});
    };
    door_ = std::make_unique<http_door::HttpDoor>(
        std::move(door),
        [this](Request req, std::shared_ptr<Exchange> ex) { Handle(req, std::move(ex)); });
  }

  ~Impl() {
    Stop();
    if (status_thread_.joinable()) status_thread_.join();
    // The door first: its handler threads and the responses it still holds use the members
    // below (the in-flight count, the metrics).
    door_.reset();
    fork_submitter_.reset();
  }

  Status Bind() {
    // A client that goes away mid-write must not kill the process.
    ::signal(SIGPIPE, SIG_IGN);
    return door_->Bind();
  }

  bool Run() {
    if (options_.status_interval_s > 0) status_thread_ = std::thread([this] { StatusLoop(); });
    door_->Run();
    SignalStatusStop();
    if (status_thread_.joinable()) status_thread_.join();
    return true;
  }

  void Stop() {
    door_->Stop();
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

  int port() const { return door_->port(); }
  size_t max_connections() const { return door_->max_connections(); }
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

  void Handle(const Request& req, std::shared_ptr<Exchange> ex);
  void HandleGenerate(Endpoint endpoint, const Request& req, std::shared_ptr<Exchange> ex,
                      Headers cors);
  // The CORS grant of an allowed origin (errors carry it too, so browsers can read them).
  Headers CorsHeaders(const Request& req) const;
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
  std::unique_ptr<http_door::HttpDoor> door_;
  // Submits the forks of n > 1 requests (ChoiceSet::SubmitForks), off the event loop and off the
  // handler threads; destroyed after the door (it runs what was posted, then joins).
  std::unique_ptr<TaskThread> fork_submitter_ = std::make_unique<TaskThread>();
  std::atomic<bool> draining_{false};  // lock-free

  Mutex inflight_mu_;
  CondVar inflight_cv_;
  int inflight_ TANDEM_GUARDED_BY(inflight_mu_) = 0;

  Mutex status_mu_;
  CondVar status_cv_;
  bool status_stop_ TANDEM_GUARDED_BY(status_mu_) = false;
  std::thread status_thread_;
};

Headers HttpServer::Impl::CorsHeaders(const Request& req) const {
  const std::string origin = req.Header("Origin");
  if (origin.empty() || !OriginAllowed(origin)) return {};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

void HttpServer::Impl::Handle(const Request& req, std::shared_ptr<Exchange> ex) {
  Headers cors = CorsHeaders(req);
  auto answer = [&](Response res) {
    for (const auto& [name, value] : cors) res.SetHeader(name, value);
    ex->Respond(std::move(res));
  };
  auto fail = [&](const ApiError& e, Outcome outcome) {
    metrics_->CountOutcome(outcome);
    answer(ErrorResponse(e));
  };
  // A preflight is answered before the API key check: browsers never send credentials with one.
  if (req.method == "OPTIONS") {
    Response res{204, "", "", {{"Allow", "GET, POST, OPTIONS"}}};
    if (!cors.empty()) {
      const std::string asked = req.Header("Access-Control-Request-Headers");
      res.SetHeader("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.SetHeader("Access-Control-Allow-Headers",
                    asked.empty() ? "Authorization, Content-Type" : asked);
      res.SetHeader("Access-Control-Max-Age", "86400");
    }
    answer(std::move(res));
    return;
  }
  const bool protected_path =
      req.path.rfind("/v1/", 0) == 0 || req.path == "/tokenize" || req.path == "/detokenize";
  if (protected_path && !options_.api_key.empty()) {
    const std::string auth = req.Header("Authorization");
    const std::string prefix = "Bearer ";
    if (auth.rfind(prefix, 0) != 0 ||
        !ConstantTimeEquals(auth.substr(prefix.size()), options_.api_key)) {
      fail({401,
            auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                         : "incorrect API key provided",
            "invalid_request_error", "", "invalid_api_key"},
           Outcome::kBadRequest);
      return;
    }
  }
  if (protected_path && draining_.load() && req.method == "POST") {
    fail({503, "the server is shutting down", "server_error", "", ""}, Outcome::kRejected);
    return;
  }

  const bool post = req.method == "POST";
  const bool get = req.method == "GET";
  if (post && req.path == "/v1/chat/completions") {
    HandleGenerate(Endpoint::kChatCompletions, req, std::move(ex), std::move(cors));
  } else if (post && req.path == "/v1/completions") {
    HandleGenerate(Endpoint::kCompletions, req, std::move(ex), std::move(cors));
  } else if (post && (req.path == "/tokenize" || req.path == "/detokenize")) {
    // vLLM's tokenizer endpoints (server/tokenize.h).
    std::string body;
    const std::optional<ApiError> e =
        req.path == "/tokenize" ? Tokenize(req.body, limits_, *model_.tokenizer,
                                           model_.chat_template, model_.chat_template_error, &body)
                                : Detokenize(req.body, limits_, *model_.tokenizer, &body);
    if (e) {
      fail(*e, Outcome::kBadRequest);
    } else {
      answer(JsonResponse(std::move(body)));
    }
  } else if (get && req.path == "/v1/models") {
    std::vector<std::string> names = {options_.served_model_name};
    names.insert(names.end(), options_.model_aliases.begin(), options_.model_aliases.end());
    answer(JsonResponse(ModelsBody(names, created_)));
  } else if (get && req.path == "/health") {
    answer(draining_.load() ? Response{503, kJson, R"({"status":"draining"})", {}}
                            : JsonResponse(R"({"status":"ok"})"));
  } else if (get && req.path == "/dashboard") {
    answer(Response{200, "text/html; charset=utf-8", DashboardPage(), {}});
  } else if (get && req.path == "/dashboard/data") {
    answer(JsonResponse(DashboardJson(metrics_->Get(), backend_->Stats(),
                                      options_.served_model_name, door_->Stats()),
                        {{"Cache-Control", "no-store"}}));
  } else if (get && req.path == "/metrics") {
    answer(Response{200,
                    "text/plain; version=0.0.4; charset=utf-8",
                    metrics_->Render(backend_->Stats(), door_->Stats()),
                    {}});
  } else if (KnownPath(req.path)) {
    answer(ErrorResponse(
        {405, "method " + req.method + " is not allowed for " + req.path, "invalid_request_error",
         "", ""},
        {{"Allow", req.path.rfind("/v1/models", 0) == 0 || req.path == "/health" ||
                           req.path == "/metrics" || req.path.rfind("/dashboard", 0) == 0
                       ? "GET, OPTIONS"
                       : "POST, OPTIONS"}}));
  } else {
    answer(ErrorResponse({404, "no route for " + req.method + " " + req.path,
                          "invalid_request_error", "", "not_found"}));
  }
}

bool HttpServer::Impl::OriginAllowed(const std::string& origin) const {
  for (const std::string& allowed : options_.allowed_origins) {
    if (allowed == "*" || allowed == origin) return true;
  }
  return false;
}

void HttpServer::Impl::HandleGenerate(Endpoint endpoint, const Request& req,
                                      std::shared_ptr<Exchange> ex, Headers cors) {
  auto fail = [&](const ApiError& e, Outcome outcome, Headers extra = {}) {
    metrics_->CountOutcome(outcome);
    for (const auto& h : cors) extra.push_back(h);
    ex->Respond(ErrorResponse(e, std::move(extra)));
  };
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
    log_->debug("rejected request ({}): {}", error->status, error->message);
    fail(*error, Outcome::kBadRequest);
    return;
  }

  const std::string id = NewRequestId(endpoint);
  const auto timeout = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(options_.request_timeout_s));
  const Clock::time_point deadline = arrival + timeout;
  const int total = static_cast<int>(prompts.size()) * parsed.n;
  auto doorbell = std::make_shared<Doorbell>();
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
                      parsed.sampling.tool_mode != engine::SamplingParams::ToolMode::kNone,
                      parsed.sampling.tool_format};
  auto choices = std::make_shared<ChoiceSet>(ctx, std::move(runs), parsed.n, doorbell);
  const Status st = choices->Submit(backend_);
  if (!st.ok()) {
    Outcome outcome = Outcome::kError;
    const ApiError e = SubmitError(st, &outcome);
    log_->info("{} rejected: {}", id, st.ToString());
    Headers extra;
    if (e.status == 429) {
      extra.emplace_back("Retry-After", std::to_string(std::max(1, backend_->RetryAfterSeconds())));
    }
    fail(e, outcome, std::move(extra));
    return;
  }
  PumpOptions pump;
  pump.stream = parsed.stream;
  pump.timeout_s = options_.request_timeout_s;
  pump.give_up = deadline + kDeadlineGrace;
  pump.headers = std::move(cors);
  if (parsed.n > 1) {
    pump.submit_forks = [this, id,
                         weak = std::weak_ptr<ChoiceSet>(choices)](std::vector<size_t> due) {
      fork_submitter_->Post([this, id, weak, due = std::move(due)] {
        std::shared_ptr<ChoiceSet> set = weak.lock();
        if (!set) return;  // the response is over
        const Status st = set->SubmitForks(due, backend_);
        if (st.ok()) return;
        Outcome outcome = Outcome::kError;
        SubmitError(st, &outcome);
        metrics_->CountOutcome(outcome);
        log_->info("a choice of {} refused: {}", id, st.ToString());
      });
    };
  }
  StartResponsePump(std::move(choices), std::move(ex), std::move(pump), std::move(inflight));
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
size_t HttpServer::max_connections() const { return impl_->max_connections(); }
bool HttpServer::Run() { return impl_->Run(); }
void HttpServer::BeginDrain() { impl_->BeginDrain(); }
bool HttpServer::draining() const { return impl_->draining(); }
bool HttpServer::WaitIdle(std::chrono::steady_clock::time_point deadline) {
  return impl_->WaitIdle(deadline);
}
void HttpServer::Stop() { impl_->Stop(); }
const ServerMetrics& HttpServer::metrics() const { return impl_->metrics(); }

}  // namespace tandem::server
