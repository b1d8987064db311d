#include "cluster/conductor.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "common/logging.h"

namespace tandem::cluster {
namespace {

using nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

int64_t MillisUntil(Clock::time_point t) {
  if (t == Clock::time_point::max()) return 3600 * 1000;
  return std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count());
}

// An HTTP client to a worker with connect/read timeouts bounded by the request's deadline.
std::unique_ptr<httplib::Client> ClientFor(const WorkerInfo& w, Clock::time_point deadline) {
  auto c = std::make_unique<httplib::Client>(w.host, w.port);
  c->set_connection_timeout(2, 0);
  const int64_t ms = std::min<int64_t>(MillisUntil(deadline) + 5000, 24LL * 3600 * 1000);
  c->set_read_timeout(ms / 1000, (ms % 1000) * 1000);
  c->set_write_timeout(10, 0);
  c->set_keep_alive(false);
  return c;
}

struct WorkerState {
  WorkerInfo info;
  bool healthy = false;
  Clock::time_point last_ok{};
  int inflight = 0;
  WorkerStats stats;
};

class ConductorImpl final : public Conductor {
 public:
  explicit ConductorImpl(ConductorOptions o) : options_(std::move(o)), log_(GetLogger("conductor")) {
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }

  ~ConductorImpl() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    heartbeat_.join();
    // Request threads end by their deadlines; make them stop relaying now.
    cancel_all_.store(true);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(30), [&] { return active_ == 0; });
  }

  Status Submit(serving::GenerationRequest request,
                std::shared_ptr<serving::GenerationSink> sink) override {
    const int n_prompt = static_cast<int>(request.prompt_tokens.size());
    TANDEM_RETURN_IF_ERROR(serving::ValidateRequest(
        request, options_.vocab_size > 0 ? options_.vocab_size : INT32_MAX,
        options_.max_model_len > 0 ? options_.max_model_len : INT32_MAX));
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || stop_) return FailedPrecondition("the server is shutting down");
    if (active_ >= options_.max_inflight) {
      return ResourceExhausted("too many requests in flight (" +
                               std::to_string(options_.max_inflight) + ")");
    }
    auto [loads, names] = LoadsLocked();
    const Placement p = PlaceRequest(loads, {n_prompt, request.max_tokens});
    if (p.decode < 0) {
      rejected_.fetch_add(1);
      return Status(StatusCode::kUnavailable, p.reject_reason);
    }
    const std::string decode = names[p.decode];
    const std::string prefill = p.local ? std::string() : names[p.prefill];
    workers_[decode].inflight++;
    if (!prefill.empty()) workers_[prefill].inflight++;
    ++active_;
    std::thread([this, request = std::move(request), sink = std::move(sink), decode,
                 prefill]() mutable { Run(std::move(request), std::move(sink), decode, prefill); })
        .detach();
    return OkStatus();
  }

  serving::BackendStats Stats() const override {
    serving::BackendStats s;
    std::map<std::string, std::pair<int, int>> by_role;  // role -> (healthy, all)
    uint64_t transfer_failures = 0, transfer_timeouts = 0, kv_wait_timeouts = 0, kv_bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [name, w] : workers_) {
        auto& r = by_role[RoleName(w.info.role)];
        r.second++;
        if (!w.healthy) continue;
        r.first++;
        const auto& b = w.stats.backend;
        s.running += b.running;
        s.waiting += b.waiting;
        s.kv_blocks_total += b.kv_blocks_total;
        s.kv_blocks_used += b.kv_blocks_used;
        s.kv_blocks_cached += b.kv_blocks_cached;
        s.prefix_cache_hit_tokens += b.prefix_cache_hit_tokens;
        s.prompt_tokens += b.prompt_tokens;
        s.generated_tokens += b.generated_tokens;
        s.preemptions += b.preemptions;
        s.reserved_blocks += b.reserved_blocks;
        s.reservations_expired += b.reservations_expired;
        transfer_failures += w.stats.transfer_failures;
        transfer_timeouts += w.stats.transfer_timeouts;
        kv_wait_timeouts += w.stats.kv_wait_timeouts;
        kv_bytes += w.stats.kv_bytes_pushed;
      }
    }
    for (const char* role : {"prefill", "decode", "mixed"}) {
      const auto it = by_role.find(role);
      const auto counts = it == by_role.end() ? std::make_pair(0, 0) : it->second;
      s.extra.push_back({"tandem_workers", "Workers known to the conductor, by role and state.",
                         false, {{"role", role}, {"state", "healthy"}}, double(counts.first)});
      s.extra.push_back({"tandem_workers", "", false, {{"role", role}, {"state", "unhealthy"}},
                         double(counts.second - counts.first)});
    }
    auto counter = [&](const char* name, const char* help, double v) {
      s.extra.push_back({name, help, true, {}, v});
    };
    counter("tandem_disaggregated_requests_total",
            "Requests whose prompt was computed on a prefill worker and KV moved to a decode worker.",
            double(disaggregated_.load()));
    counter("tandem_colocated_fallback_requests_total",
            "Requests served without disaggregation (the decode worker computed the prompt: no "
            "prefill worker was available or all failed).",
            double(fallbacks_.load()));
    counter("tandem_prefill_retries_total", "Prefill attempts that failed and were retried elsewhere.",
            double(prefill_retries_.load()));
    counter("tandem_worker_failures_total",
            "Requests that failed because a worker's connection broke or it answered an error.",
            double(worker_failures_.load()));
    counter("tandem_placement_rejections_total", "Requests rejected because no worker could take them.",
            double(rejected_.load()));
    counter("tandem_worker_restarts_total", "Worker processes restarted by the supervisor.",
            double(restarts_.load()));
    counter("tandem_kv_transfer_failures_total",
            "KV pushes that failed (sum over live prefill workers).", double(transfer_failures));
    counter("tandem_kv_transfer_timeouts_total",
            "KV pushes that timed out (sum over live prefill workers).", double(transfer_timeouts));
    counter("tandem_kv_wait_timeouts_total",
            "Decode reservations whose KV never arrived (sum over live decode workers).",
            double(kv_wait_timeouts));
    counter("tandem_kv_transfer_bytes_total", "KV bytes pushed from prefill to decode workers.",
            double(kv_bytes));
    return s;
  }

  void Drain(Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    draining_ = true;
    if (!cv_.wait_until(lock, deadline, [&] { return active_ == 0; })) {
      cancel_all_.store(true);
      cv_.wait_for(lock, std::chrono::seconds(10), [&] { return active_ == 0; });
    }
  }

  Status WaitForWorkers(int prefill, int decode, Clock::time_point deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto enough = [&] {
      int p = 0, d = 0;
      for (const auto& [name, w] : workers_) {
        if (!w.healthy) continue;
        if (w.info.role == Role::kPrefill) ++p;
        if (CanDecode(w.info.role)) ++d;
      }
      return p >= prefill && d >= decode;
    };
    if (!cv_.wait_until(lock, deadline, enough)) {
      return Status(StatusCode::kDeadlineExceeded,
                    "workers did not join in time (wanted " + std::to_string(prefill) +
                        " prefill and " + std::to_string(decode) + " decode)");
    }
    return OkStatus();
  }

  std::vector<WorkerView> Workers() const override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<WorkerView> out;
    for (const auto& [name, w] : workers_) out.push_back({w.info, w.healthy, w.inflight, w.stats});
    return out;
  }

  void CountWorkerRestart(Role) override { restarts_.fetch_add(1); }

 private:
  std::pair<std::vector<WorkerLoad>, std::vector<std::string>> LoadsLocked() const {
    std::vector<WorkerLoad> loads;
    std::vector<std::string> names;
    for (const auto& [name, w] : workers_) {
      WorkerLoad l;
      l.name = name;
      l.role = w.info.role;
      l.healthy = w.healthy;
      l.inflight = w.inflight;
      const auto& b = w.stats.backend;
      l.kv_free_blocks = b.kv_blocks_total - b.kv_blocks_used;  // cached blocks are reclaimable
      l.block_tokens = w.info.block_tokens;
      loads.push_back(l);
      names.push_back(name);
    }
    return {loads, names};
  }

  // ---- membership ----

  void HeartbeatLoop() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_for(lock, options_.heartbeat, [&] { return stop_; })) return;
      }
      RefreshMembership();
    }
  }

  void RefreshMembership() {
    auto listed = options_.metadata->List(kWorkersPrefix);
    if (!listed.ok()) {
      log_->warn("cannot list workers: {}", listed.status().ToString());
      return;
    }
    std::vector<WorkerInfo> infos;
    for (const auto& [key, value] : *listed) {
      auto info = WorkerInfo::FromJson(value);
      if (info.ok()) infos.push_back(std::move(*info));
    }
    // Probe outside the lock: a slow worker must not stall placement.
    std::vector<std::pair<WorkerInfo, StatusOr<WorkerStats>>> probes;
    for (auto& info : infos) {
      httplib::Client c(info.host, info.port);
      c.set_connection_timeout(0, 300 * 1000);
      c.set_read_timeout(1, 0);
      auto res = c.Get("/stats");
      StatusOr<WorkerStats> stats =
          res && res->status == 200
              ? WorkerStats::FromJson(res->body)
              : StatusOr<WorkerStats>(Status(StatusCode::kUnavailable, "no answer to /stats"));
      probes.emplace_back(std::move(info), std::move(stats));
    }
    const auto now = Clock::now();
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, bool> listed_names;
    for (auto& [info, stats] : probes) {
      listed_names[info.name] = true;
      WorkerState& w = workers_[info.name];
      if (w.info.incarnation != info.incarnation) {
        if (w.info.incarnation != 0) {
          log_->info("worker {} rejoined ({} on {}:{})", info.name, RoleName(info.role), info.host,
                     info.port);
        } else {
          log_->info("worker {} joined ({} on {}:{})", info.name, RoleName(info.role), info.host,
                     info.port);
        }
        w.info = info;
        w.healthy = false;
      }
      if (stats.ok()) {
        w.stats = std::move(*stats);
        w.last_ok = now;
        w.healthy = true;
      } else if (now - w.last_ok > options_.worker_timeout && w.healthy) {
        log_->warn("worker {} stopped answering; not placing requests there", info.name);
        w.healthy = false;
      }
    }
    for (auto& [name, w] : workers_) {
      if (!listed_names.count(name) && w.healthy) {
        // Expected while shutting down (the workers unpublish themselves); a warning otherwise.
        log_->log(draining_ ? spdlog::level::info : spdlog::level::warn,
                  "worker {} left the metadata service", name);
        w.healthy = false;
      }
    }
    cv_.notify_all();
  }

  // Marks a worker unhealthy at once (a broken connection), until its next good heartbeat.
  void Suspect(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(name);
    if (it != workers_.end()) it->second.healthy = false;
  }

  std::optional<WorkerInfo> InfoOf(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(name);
    if (it == workers_.end()) return std::nullopt;
    return it->second.info;
  }

  // Another healthy prefill worker, not among `tried`; counted in flight.
  std::string NextPrefill(const std::vector<std::string>& tried, const serving::GenerationRequest& r) {
    std::lock_guard<std::mutex> lock(mu_);
    auto [loads, names] = LoadsLocked();
    std::vector<int> exclude;
    for (size_t i = 0; i < names.size(); ++i) {
      if (std::find(tried.begin(), tried.end(), names[i]) != tried.end()) exclude.push_back(int(i));
    }
    const Placement p = PlaceRequest(loads, {int(r.prompt_tokens.size()), r.max_tokens}, exclude);
    if (p.prefill < 0) return {};
    workers_[names[p.prefill]].inflight++;
    return names[p.prefill];
  }

  void Release(const std::string& name) {
    if (name.empty()) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(name);
    if (it != workers_.end() && it->second.inflight > 0) it->second.inflight--;
  }

  // ---- one request ----

  struct Progress {
    bool fall_back_local = false;    // stop this stream and run the request locally
    bool cancelled = false;          // the client went away
    int tokens = 0;                  // tokens given to the sink
    std::optional<serving::FinishInfo> finish;
    Status error;
    std::optional<PrefillResult> prefill;
    Clock::time_point first_token_at{};
  };

  // Runs the prefill of a reserved request, trying prefill workers until one succeeds.
  // Returns false when none could (the caller falls back to local).
  bool Prefill(const serving::GenerationRequest& r, const KvTarget& target,
               std::string* prefill_name, Progress* progress) {
    std::vector<std::string> tried;
    while (!prefill_name->empty()) {
      tried.push_back(*prefill_name);
      const auto info = InfoOf(*prefill_name);
      Status st;
      if (info) {
        PrefillCall call;
        call.id = r.id;
        call.prompt_tokens = r.prompt_tokens;
        call.sampling = r.sampling;
        call.timeout_ms = MillisUntil(r.deadline);
        call.target = target;
        auto client = ClientFor(*info, r.deadline);
        auto res = client->Post("/v1/prefill", call.ToJson(), "application/json");
        if (!res) {
          st = Status(StatusCode::kUnavailable, "prefill worker " + *prefill_name + " failed: " +
                                                    httplib::to_string(res.error()));
          Suspect(*prefill_name);
        } else if (res->status != 200) {
          st = StatusFromErrorJson(res->body, "prefill worker " + *prefill_name + " answered " +
                                                  std::to_string(res->status));
        } else {
          auto result = PrefillResult::FromJson(res->body);
          if (result.ok()) {
            progress->prefill = *result;
            return true;
          }
          st = result.status();
        }
      } else {
        st = NotFound("prefill worker " + *prefill_name + " is gone");
      }
      log_->warn("{}: prefill on {} failed: {}", r.id, *prefill_name, st.ToString());
      if (Clock::now() >= r.deadline) {
        progress->error = Status(StatusCode::kDeadlineExceeded, "the request deadline passed");
        return false;
      }
      Release(*prefill_name);
      *prefill_name = NextPrefill(tried, r);
      if (!prefill_name->empty()) prefill_retries_.fetch_add(1);
    }
    return false;
  }

  void Run(serving::GenerationRequest r, std::shared_ptr<serving::GenerationSink> sink,
           std::string decode_name, std::string prefill_name) {
    Progress progress;
    bool local = prefill_name.empty();
    for (int attempt = 0; attempt < 2; ++attempt) {
      progress.fall_back_local = false;
      if (local) fallbacks_.fetch_add(1);
      RunOnDecode(r, sink.get(), decode_name, &prefill_name, local, &progress);
      if (!progress.fall_back_local || progress.cancelled || progress.tokens > 0) break;
      local = true;  // no prefill worker could do it: the decode worker computes the prompt
      log_->warn("{}: no prefill worker succeeded; computing the prompt on {}", r.id, decode_name);
    }
    if (!local && progress.finish) disaggregated_.fetch_add(1);

    serving::FinishInfo info;
    const auto now = Clock::now();
    if (progress.finish) {
      info = *progress.finish;
    } else if (progress.cancelled || cancel_all_.load()) {
      info.reason = serving::FinishReason::kCancelled;
      info.message = progress.cancelled ? "cancelled by the client" : "the server stopped";
    } else {
      const Status& e = progress.error.ok()
                            ? Status(StatusCode::kUnavailable, "decode worker " + decode_name +
                                                                   " ended the stream early")
                            : progress.error;
      info.reason = e.code() == StatusCode::kDeadlineExceeded ? serving::FinishReason::kTimeout
                                                              : serving::FinishReason::kError;
      info.message = e.message();
      if (info.reason == serving::FinishReason::kError) worker_failures_.fetch_add(1);
    }
    info.prompt_tokens = static_cast<int>(r.prompt_tokens.size());
    info.completion_tokens = std::max(info.completion_tokens, progress.tokens);
    info.total_seconds = Seconds(now - r.arrival);
    info.ttft_seconds = progress.tokens > 0 ? Seconds(progress.first_token_at - r.arrival) : 0;
    if (progress.prefill && !local) {
      info.cached_prompt_tokens = progress.prefill->cached_tokens;
      info.queue_seconds = progress.prefill->queue_seconds;
      info.prefill_seconds = progress.prefill->prefill_seconds;
      info.kv_transfer_seconds = progress.prefill->transfer_seconds;
    } else {
      // Not disaggregated: no hand-off to break the TTFT into.
      info.prefill_seconds = info.kv_transfer_seconds = info.first_decode_seconds = -1;
      if (!progress.finish) info.queue_seconds = info.total_seconds;
    }
    Release(decode_name);
    Release(prefill_name);
    sink->OnFinish(info);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --active_;
    }
    cv_.notify_all();
  }

  // One /v1/decode stream. Sets progress->fall_back_local when the prompt must be redone locally.
  void RunOnDecode(const serving::GenerationRequest& r, serving::GenerationSink* sink,
                   const std::string& decode_name, std::string* prefill_name, bool local,
                   Progress* progress) {
    const auto info = InfoOf(decode_name);
    if (!info) {
      progress->error = Status(StatusCode::kUnavailable, "decode worker " + decode_name + " is gone");
      return;
    }
    DecodeCall call;
    call.id = r.id;
    call.prompt_tokens = r.prompt_tokens;
    call.max_tokens = r.max_tokens;
    call.ignore_eos = r.ignore_eos;
    call.sampling = r.sampling;
    call.timeout_ms = MillisUntil(r.deadline);
    call.kv_wait_ms = std::min<int64_t>(call.timeout_ms, options_.kv_wait.count());
    call.local = local;

    auto client = ClientFor(*info, r.deadline);
    std::string buffer;
    auto emit = [&](int32_t token) {
      if (progress->tokens == 0) progress->first_token_at = Clock::now();
      ++progress->tokens;
      if (cancel_all_.load() || !sink->OnToken(token)) {
        progress->cancelled = !cancel_all_.load();
        return false;
      }
      return true;
    };
    auto on_event = [&](const DecodeEvent& e) -> bool {
      switch (e.kind) {
        case DecodeEvent::Kind::kReserved: {
          if (!Prefill(r, e.reserved, prefill_name, progress)) {
            // Free the reservation, then (unless the deadline passed) redo it locally.
            auto c = ClientFor(*info, Clock::now() + std::chrono::seconds(2));
            c->Post("/v1/cancel", json{{"id", r.id}}.dump(), "application/json");
            progress->fall_back_local = progress->error.ok();
            return false;
          }
          return emit(progress->prefill->first_token);
        }
        case DecodeEvent::Kind::kToken:
          return emit(e.token);
        case DecodeEvent::Kind::kFinish:
          progress->finish = e.finish;
          return true;
        case DecodeEvent::Kind::kError:
          progress->error = e.error;
          return true;
      }
      return true;
    };
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/decode";
    req.body = call.ToJson();
    req.set_header("Content-Type", "application/json");
    int http_status = 0;
    std::string error_body;
    req.response_handler = [&](const httplib::Response& res) {
      http_status = res.status;
      return true;
    };
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      if (http_status != 200) {
        error_body.append(data, len);
        return true;
      }
      buffer.append(data, len);
      size_t start = 0;
      for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
        auto e = DecodeEvent::FromJson(buffer.substr(start, nl - start));
        if (!e.ok()) {
          progress->error = e.status();
          return false;
        }
        if (!on_event(*e)) return false;
      }
      buffer.erase(0, start);
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    const bool sent = client->send(req, res, err);
    if (http_status != 0 && http_status != 200) {
      progress->error = StatusFromErrorJson(error_body, "decode worker " + decode_name +
                                                            " answered " + std::to_string(http_status));
      return;
    }
    if (!sent && !progress->finish && !progress->cancelled && !progress->fall_back_local &&
        progress->error.ok()) {
      Suspect(decode_name);
      progress->error = Status(StatusCode::kUnavailable, "decode worker " + decode_name +
                                                             " failed: " + httplib::to_string(err));
    }
  }

  ConductorOptions options_;
  std::shared_ptr<spdlog::logger> log_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, WorkerState> workers_;  // guarded by mu_
  int active_ = 0;                               // request threads running; guarded by mu_
  bool draining_ = false;
  bool stop_ = false;
  std::atomic<bool> cancel_all_{false};

  std::atomic<int64_t> disaggregated_{0};
  std::atomic<int64_t> fallbacks_{0};
  std::atomic<int64_t> prefill_retries_{0};
  std::atomic<int64_t> worker_failures_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> restarts_{0};

  std::thread heartbeat_;  // last: starts after the members above exist
};

}  // namespace

StatusOr<std::unique_ptr<Conductor>> Conductor::Start(ConductorOptions options) {
  if (!options.metadata) return InvalidArgument("the conductor needs a metadata store");
  return std::unique_ptr<Conductor>(std::make_unique<ConductorImpl>(std::move(options)));
}

}  // namespace tandem::cluster
