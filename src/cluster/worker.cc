#include "cluster/worker.h"

#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <filesystem>
#include <future>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/calibration.h"
#include "cluster/kv_pusher.h"
#include "cluster/mock_step.h"
#include "cluster/pipeline_stage.h"
#include "cluster/pool_bridge.h"
#include "common/cluster_auth.h"
#include "common/http.h"
#include "common/http_status.h"
#include "common/json_numbers.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "engine/engine.h"
#include "serving/local_backend.h"

namespace tandem::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void ReplyError(httplib::Response& res, const Status& st) {
  res.status = HttpStatusFor(st.code());
  res.set_content(ErrorJson(st), "application/json");
}

// The lines of one /v1/decode response, produced by the engine loop (tokens) or the hand-off
// thread, consumed by the HTTP thread that writes the stream.
class DecodeStream {
 public:
  void Push(const DecodeEvent& e) TANDEM_EXCLUDES(mu_) {
    {
      MutexLock lock(&mu_);
      lines_.push_back(e.ToJson() + "\n");
      if (e.kind == DecodeEvent::Kind::kFinish || e.kind == DecodeEvent::Kind::kError) done_ = true;
    }
    cv_.NotifyAll();
  }
  // Takes the lines available, waiting up to `wait`. Sets *done when the stream is complete.
  std::vector<std::string> Take(std::chrono::milliseconds wait, bool* done) TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, wait, [&] {
      mu_.AssertHeld();
      return !lines_.empty() || done_;
    });
    std::vector<std::string> out(lines_.begin(), lines_.end());
    lines_.clear();
    *done = done_;
    return out;
  }
  bool done() const TANDEM_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    return done_;
  }
  void MarkClientGone() { client_gone_.store(true); }
  bool client_gone() const { return client_gone_.load(); }

 private:
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<std::string> lines_ TANDEM_GUARDED_BY(mu_);
  bool done_ TANDEM_GUARDED_BY(mu_) = false;
  std::atomic<bool> client_gone_{false};  // lock-free: set by the HTTP thread, polled by the sink
};

// Relays a decode-side request's tokens into its stream.
class StreamSink : public serving::GenerationSink {
 public:
  StreamSink(std::shared_ptr<DecodeStream> stream, Clock::time_point kv_landed)
      : stream_(std::move(stream)), kv_landed_(kv_landed) {}
  bool OnToken(const engine::SampledToken& token) override {
    if (!first_seen_) {
      first_seen_ = true;
      first_decode_seconds_ = Seconds(Clock::now() - kv_landed_);
    }
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kToken;
    e.token = token;
    stream_->Push(e);
    return !stream_->client_gone();
  }
  void OnPromptLogprobs(std::vector<engine::SampledToken> tokens) override {
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kPromptLogprobs;
    e.prompt_logprobs = std::move(tokens);
    stream_->Push(e);
  }
  void OnFinish(const serving::FinishInfo& info) override {
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kFinish;
    e.finish = info;
    e.finish.first_decode_seconds = first_seen_ ? first_decode_seconds_ : -1;
    stream_->Push(e);
  }

 private:
  std::shared_ptr<DecodeStream> stream_;
  Clock::time_point kv_landed_;
  bool first_seen_ = false;
  double first_decode_seconds_ = -1;
};

// The transfer-engine notification that tells a decode worker a request's KV is complete.
std::string KvReadyNotification(const std::string& id, int32_t first_token,
                                const std::string& from) {
  return json{{"kind", "kv_ready"}, {"id", id}, {"first_token", first_token}, {"from", from}}
      .dump();
}

// The prefill side's sink: at the first token, completes the KV push and notifies.
class PrefillSink : public serving::GenerationSink {
 public:
  PrefillSink(std::shared_ptr<KvPusher> pusher, std::string id, std::string from)
      : pusher_(std::move(pusher)), id_(std::move(id)), from_(std::move(from)) {}
  bool OnToken(const engine::SampledToken& token) override {
    first_token_ = token;
    push_status_ = pusher_->Finish(KvReadyNotification(id_, token.token, from_));
    return true;
  }
  void OnFinish(const serving::FinishInfo& info) override { done_.set_value(info); }

  std::future<serving::FinishInfo> future() { return done_.get_future(); }
  const engine::SampledToken& first_token() const { return first_token_; }
  const Status& push_status() const { return push_status_; }

 private:
  std::shared_ptr<KvPusher> pusher_;
  std::string id_, from_;
  engine::SampledToken first_token_;
  Status push_status_ = Internal("no token was produced");
  std::promise<serving::FinishInfo> done_;
};

class WorkerImpl final : public Worker {
 public:
  WorkerImpl() : log_(GetLogger("worker")) {}

  ~WorkerImpl() override {
    {
      // Under the lock: the hand-off loop checks the flag and sleeps atomically, so a store
      // between its check and its wait cannot be missed.
      MutexLock lock(&handoff_mu_);
      handoff_stop_.store(true);
    }
    handoff_cv_.NotifyAll();
    if (handoff_thread_.joinable()) handoff_thread_.join();
    http_.stop();
    backend_.reset();
  }

  Status Init(const WorkerOptions& o) {
    options_ = o;
    if (o.name.empty()) return InvalidArgument("a worker needs a name");
    // The metadata service may be starting at the same time (a cluster coming up): retry.
    const Clock::time_point give_up = Clock::now() + std::chrono::seconds(30);
    while (true) {
      auto opened = transfer::OpenMetadataStore(o.metadata_uri);
      if (opened.ok()) {
        metadata_ = std::move(*opened);
        break;
      }
      if (opened.status().code() != StatusCode::kUnavailable || Clock::now() >= give_up) {
        return opened.status();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    transfer::TransferEngineOptions to;
    to.local_name = o.name + "." + std::to_string(::getpid());
    to.metadata = metadata_;
    to.tcp_listen_host = o.host;
    to.protocols = o.protocols;
    TANDEM_ASSIGN_OR_RETURN(te_, transfer::TransferEngine::Create(to));
    te_->SetNotificationHandler([this](const transfer::Notification& n) { OnNotification(n); });

    const int64_t incarnation = std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::system_clock::now().time_since_epoch())
                                    .count();
    segment_name_ = o.name + "." + std::to_string(incarnation) + "/kv";
    engine::EngineOptions eo = o.engine;
    // The window arena (sliding-window models) holds what the scheduler can run at once.
    eo.max_sequences = o.scheduler.max_num_seqs;
    eo.max_step_tokens = o.scheduler.max_batch_tokens;
    eo.kv_memory = [this](size_t bytes) -> StatusOr<uint8_t*> {
      TANDEM_ASSIGN_OR_RETURN(void* p, te_->AllocateSegment(segment_name_, bytes));
      return static_cast<uint8_t*>(p);
    };
    if (o.mock_cost) eo.mock_step_seconds = MockStepFunction(*o.mock_cost);
    TANDEM_ASSIGN_OR_RETURN(engine_, engine::Engine::Load(eo));
    TANDEM_RETURN_IF_ERROR(LoadCostModels(o));
    info_.threads = engine_->threads();
    info_.max_threads = engine_->max_threads();
    info_.cost = CostAt(info_.threads);
    {
      MutexLock lock(&role_mu_);
      threads_ = info_.threads;
    }
    info_.max_batch_tokens = o.scheduler.max_batch_tokens;
    info_.max_num_seqs = o.scheduler.max_num_seqs;
    const model::ModelConfig& mc = engine_->config();
    info_.model_dim = mc.dim;
    if (mc.sliding_window > 0 && mc.NumGlobalLayers() < mc.n_layers) {
      for (int l = 0; l < mc.n_layers; ++l)
        info_.layer_windows.push_back(mc.IsSlidingLayer(l) ? mc.sliding_window : 0);
    }
    serving::SchedulerOptions so = o.scheduler;
    TANDEM_RETURN_IF_ERROR(StartPool(incarnation, &so));
    backend_ = serving::MakeLocalBackend(engine_.get(), so);

    auto& kv = engine_->kv();
    info_.name = o.name;
    info_.role = o.role;
    role_.store(o.role);
    info_.host = o.host;
    info_.pid = ::getpid();
    info_.kv_segment = segment_name_;
    info_.block_tokens = kv.shape().block_tokens;
    info_.n_layers = kv.shape().n_layers;
    info_.layer_slice_bytes = kv.LayerSliceBytes();
    info_.kv_blocks = kv.num_blocks();
    info_.model = std::filesystem::path(o.engine.model_path).filename().string();
    info_.incarnation = incarnation;

    Routes();
    HttpServerSettings settings;
    settings.threads = o.http_threads;
    settings.keep_alive_max_count = 1000;
    settings.read_timeout_s = 600;  // a decode request's stream is read for its whole life
    settings.write_timeout_s = 30;
    settings.cluster_auth = true;  // with a cluster token, only the cluster drives the worker
    TANDEM_ASSIGN_OR_RETURN(
        port_, BindHttpServer(http_, o.host, o.port, settings, "the worker's control endpoint"));
    info_.port = port_;
    handoff_thread_ = std::thread([this] { HandoffLoop(); });
    TANDEM_RETURN_IF_ERROR(metadata_->Put(std::string(kWorkersPrefix) + o.name, info_.ToJson()));
    log_->info("worker {} ({}) on {}:{}; KV segment {} ({} blocks of {} tokens, {:.1f} MiB)",
               o.name, RoleName(o.role), o.host, port_, segment_name_, kv.num_blocks(),
               kv.shape().block_tokens, kv.SizeBytes() / 1048576.0);
    return OkStatus();
  }

  int port() const override { return port_; }
  const WorkerInfo& info() const override { return info_; }

  // The cost model at each thread count the engine may be resized to (elastic pools), each
  // loaded or calibrated as `cost_profile` says (a profile is keyed by its thread count); a
  // mock worker's model is the same at every count (its steps take the model's time however
  // many threads it has). Leaves the engine at its starting count.
  Status LoadCostModels(const WorkerOptions& o) {
    const int start_threads = engine_->threads();
    CalibrationOptions cal;
    cal.max_batch_tokens = o.scheduler.max_batch_tokens;
    // A profile file given by path was measured at one count: the starting one.
    const bool named_file =
        o.cost_profile != "auto" && o.cost_profile != "calibrate" && o.cost_profile != "none";
    const bool one_model = o.mock_cost || o.cost_profile == "none" || named_file;
    for (int t = 1; t <= engine_->max_threads(); ++t) {
      if (t != start_threads && one_model) continue;
      TANDEM_RETURN_IF_ERROR(engine_->SetThreads(t));
      auto cost = o.mock_cost ? StatusOr<conductor::CostModel>(*o.mock_cost)
                              : LoadOrCalibrate(*engine_, o.cost_profile, cal);
      if (cost.ok()) {
        costs_[t] = std::move(*cost);
      } else if (t == start_threads) {
        if (named_file) return cost.status();
        log_->warn("no cost model (the conductor places this worker by load only): {}",
                   cost.status().ToString());
      } else {
        log_->warn("no cost model at {} threads (the one at {} scaled stands in): {}", t,
                   start_threads, cost.status().ToString());
      }
    }
    return engine_->SetThreads(start_threads);
  }

  // The cost model at `threads`: its own, else the starting count's scaled by the thread
  // ratio (ideal scaling, an optimistic stand-in), else none.
  conductor::CostModel CostAt(int threads) const {
    if (auto it = costs_.find(threads); it != costs_.end()) return it->second;
    auto start = costs_.find(options_.engine.threads);
    if (start == costs_.end()) return {};
    if (options_.mock_cost) return start->second;
    const double f = static_cast<double>(options_.engine.threads) / threads;
    conductor::CostModel scaled = start->second.Scaled(f, f);
    scaled.threads = threads;
    return scaled;
  }

  // The KV pool client, its DRAM segment and the serving loop's bridge to it.
  Status StartPool(int64_t incarnation, serving::SchedulerOptions* so) {
    const WorkerOptions& o = options_;
    if (!o.kv_pool || !o.scheduler.enable_prefix_cache) return OkStatus();
    auto& kv = engine_->kv();
    store::PoolClientOptions po;
    po.metadata = metadata_;
    po.engine = te_.get();
    po.node = o.name;  // each worker process is a failure domain of its own
    po.ssd_dir = o.pool_ssd_dir;
    po.ssd_bytes = o.pool_ssd_bytes;
    TANDEM_ASSIGN_OR_RETURN(pool_, store::PoolClient::Create(po));
    if (o.pool_dram_bytes > 0) {
      TANDEM_RETURN_IF_ERROR(pool_->MountDram(o.name + "." + std::to_string(incarnation) + "/pool",
                                              o.pool_dram_bytes));
    }
    auto bridge = std::make_shared<PoolBridge>(
        pool_.get(), &kv, std::filesystem::path(o.engine.model_path).filename().string(),
        std::chrono::milliseconds(2000), std::chrono::milliseconds(2000));
    pool_namespace_ = bridge->ns();
    log_->info("KV pool: namespace {}, {:.0f} MiB of DRAM contributed{}", bridge->ns(),
               o.pool_dram_bytes / 1048576.0,
               o.pool_ssd_dir.empty() ? std::string()
                                      : fmt::format(", SSD tier {} ({:.1f} GB)", o.pool_ssd_dir,
                                                    o.pool_ssd_bytes / 1e9));
    so->kv_pool = std::move(bridge);
    so->kv_pool_bytes = static_cast<int64_t>(o.pool_dram_bytes);
    return OkStatus();
  }
  bool Run() override { return http_.listen_after_bind(); }

  void Stop(Clock::time_point deadline) override {
    (void)metadata_->Delete(std::string(kWorkersPrefix) + options_.name);
    backend_->Drain(deadline);
    http_.stop();
  }

 private:
  void Routes() {
    http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(json{{"name", info_.name}, {"role", RoleName(role_.load())}}.dump(),
                      "application/json");
    });
    http_.Get("/stats", [this](const httplib::Request&, httplib::Response& res) {
      WorkerStats s;
      s.backend = backend_->Stats();
      s.kv_bytes_pushed = kv_bytes_pushed_.load();
      s.transfer_failures = transfer_failures_.load();
      s.transfer_timeouts = transfer_timeouts_.load();
      s.kv_wait_timeouts = kv_wait_timeouts_.load();
      s.auth_refusals = ClusterAuthRefusals();
      s.cached_block_keys = backend_->CachedBlockKeys();
      if (pool_) {
        s.pool_enabled = true;
        s.pool_namespace = pool_namespace_;
        s.pool = pool_->Stats();
      }
      res.set_content(s.ToJson(), "application/json");
    });
    http_.Post("/v1/prefill",
               ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                 HandlePrefill(req, res);
               }));
    http_.Post("/v1/decode",
               ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                 HandleDecode(req, res);
               }));
    http_.Post("/v1/role",
               ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                 HandleRole(req, res);
               }));
    http_.Post("/v1/threads",
               ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                 HandleThreads(req, res);
               }));
    http_.Post("/v1/cancel",
               ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                 std::string id;
                 try {
                   id = json::parse(req.body).at("id").get<std::string>();
                 } catch (const std::exception& e) {
                   return ReplyError(res, InvalidArgument(std::string("cancel: ") + e.what()));
                 }
                 CancelPending(id, Cancelled("cancelled by the conductor"));
                 stage_inbox_.Fail(id, Cancelled("cancelled by the conductor"));
                 res.set_content("{}", "application/json");
               }));
    http_.Post("/v1/stage_input",
               ClusterBodyChecked([this](const httplib::Request& req, httplib::Response& res) {
                 auto in = StageInput::Decode(req.body, engine_->config().dim);
                 if (!in.ok()) return ReplyError(res, in.status());
                 // Waits while the stage has chunks enough queued (backpressure).
                 const Status st =
                     stage_inbox_.Put(std::move(*in), Clock::now() + std::chrono::minutes(2));
                 if (!st.ok()) return ReplyError(res, st);
                 res.set_content("{}", "application/json");
               }));
  }

  // ---- role ----

  // Work of one kind in flight on this worker (a call being answered), counted for the life of
  // the object.
  class InFlight {
   public:
    explicit InFlight(std::atomic<int>* n) : n_(n) { n_->fetch_add(1); }
    ~InFlight() { n_->fetch_sub(1); }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    std::atomic<int>* n_;
  };

  void HandleRole(const httplib::Request& req, httplib::Response& res) TANDEM_EXCLUDES(role_mu_) {
    auto change = RoleChange::FromJson(req.body);
    if (!change.ok()) return ReplyError(res, change.status());
    MutexLock lock(&role_mu_);  // one switch at a time; the published info follows the role
    RoleChangeResult r;
    r.previous = role_.load();
    r.role = change->role;
    r.prefills_in_flight = prefills_in_flight_.load();
    r.decodes_in_flight = decodes_in_flight_.load();
    if (r.role != r.previous) {
      WorkerInfo published = PublishedLocked();
      published.role = r.role;
      if (Status st =
              metadata_->Put(std::string(kWorkersPrefix) + options_.name, published.ToJson());
          !st.ok()) {
        return ReplyError(res, Unavailable("cannot publish the new role: " + st.message()));
      }
      // New calls see the new role from here; calls already accepted finish as they would have.
      role_.store(r.role);
      log_->info(
          "role {} -> {} ({}); {} prefills and {} decode streams in flight finish as they are",
          RoleName(r.previous), RoleName(r.role), change->reason.empty() ? "asked" : change->reason,
          r.prefills_in_flight, r.decodes_in_flight);
    }
    res.set_content(r.ToJson(), "application/json");
  }

  // What the metadata service should hold for this worker now.
  WorkerInfo PublishedLocked() const TANDEM_REQUIRES(role_mu_) {
    WorkerInfo published = info_;
    published.role = role_.load();
    published.threads = threads_;
    published.cost = CostAt(threads_);
    return published;
  }

  void HandleThreads(const httplib::Request& req, httplib::Response& res)
      TANDEM_EXCLUDES(role_mu_) {
    auto change = ThreadsChange::FromJson(req.body);
    if (!change.ok()) return ReplyError(res, change.status());
    MutexLock lock(&role_mu_);  // one change at a time; the published info follows it
    ThreadsChangeResult r;
    r.previous = threads_;
    r.threads = change->threads;
    if (r.threads != r.previous) {
      // The engine first: from its next step it computes on the new count.
      if (Status st = backend_->SetEngineThreads(r.threads); !st.ok()) return ReplyError(res, st);
      threads_ = r.threads;
      log_->info("threads {} -> {} ({})", r.previous, r.threads,
                 change->reason.empty() ? "asked" : change->reason);
    }
    // Published even when unchanged, so that a retry after a failed publication catches up.
    if (Status st =
            metadata_->Put(std::string(kWorkersPrefix) + options_.name, PublishedLocked().ToJson());
        !st.ok()) {
      return ReplyError(res, Unavailable("the engine computes on " + std::to_string(r.threads) +
                                         " threads, but cannot publish it: " + st.message()));
    }
    res.set_content(r.ToJson(), "application/json");
  }

  // ---- prefill side ----

  StatusOr<transfer::SegmentHandle> OpenSegment(const std::string& name)
      TANDEM_EXCLUDES(segments_mu_) {
    MutexLock lock(&segments_mu_);
    auto it = segments_.find(name);
    if (it != segments_.end()) return it->second;
    TANDEM_ASSIGN_OR_RETURN(transfer::SegmentHandle h, te_->OpenSegment(name));
    segments_[name] = h;
    return h;
  }

  // A segment whose transfer failed is closed: its owner may be gone (a restarted worker
  // publishes a new segment name).
  void DropSegment(const std::string& name) TANDEM_EXCLUDES(segments_mu_) {
    MutexLock lock(&segments_mu_);
    auto it = segments_.find(name);
    if (it == segments_.end()) return;
    (void)te_->CloseSegment(it->second);
    segments_.erase(it);
  }

  void HandlePrefill(const httplib::Request& req, httplib::Response& res) {
    const InFlight in_flight(&prefills_in_flight_);
    if (!CanPrefill(role_.load())) {
      return ReplyError(res, FailedPrecondition("worker " + options_.name + " does not prefill"));
    }
    auto call = PrefillCall::FromJson(req.body);
    if (!call.ok()) return ReplyError(res, call.status());
    const int n_prompt = static_cast<int>(call->prompt_tokens.size());
    if (Status st = KvPusher::CheckTarget(engine_->kv(), call->target, n_prompt); !st.ok()) {
      return ReplyError(res, st);
    }
    auto handle = OpenSegment(call->target.segment);
    if (!handle.ok()) {
      return ReplyError(res, Unavailable("cannot open the decode worker's KV segment: " +
                                         handle.status().message()));
    }
    const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(call->timeout_ms);
    auto pusher = std::make_shared<KvPusher>(te_.get(), &engine_->kv(), *handle, call->target,
                                             n_prompt, deadline, options_.kv_transfer_timeout);
    if (call->stage.pipelined()) return HandleStage(*call, *pusher, deadline, res);
    auto sink = std::make_shared<PrefillSink>(pusher, call->id, options_.name);
    auto finished = sink->future();
    serving::GenerationRequest g;
    g.id = call->id;
    g.prompt_tokens = std::move(call->prompt_tokens);
    g.max_tokens = 1;
    g.ignore_eos = true;
    g.sampling = call->sampling;
    g.deadline = deadline;
    if (Status st = backend_->SubmitObserved(std::move(g), sink, pusher); !st.ok()) {
      return ReplyError(res, st);
    }
    // The backend finishes every request by its deadline; the slack covers the last step.
    if (finished.wait_until(deadline + std::chrono::seconds(10)) != std::future_status::ready) {
      return ReplyError(res, DeadlineExceeded("prefill did not finish in time"));
    }
    const serving::FinishInfo info = finished.get();
    kv_bytes_pushed_.fetch_add(pusher->bytes_sent());
    if (info.completion_tokens < 1) {
      return ReplyError(res, info.reason == serving::FinishReason::kTimeout
                                 ? DeadlineExceeded("prefill: " + info.message)
                                 : Internal("prefill failed: " + info.message));
    }
    if (!sink->push_status().ok()) {
      CountPushFailure(*pusher, call->target.segment);
      log_->warn("{}: {}", call->id, sink->push_status().ToString());
      return ReplyError(res, Unavailable(sink->push_status().message()));
    }
    PrefillResult r;
    r.first_token = sink->first_token();
    r.cached_tokens = info.cached_prompt_tokens;
    r.queue_seconds = info.queue_seconds;
    r.transfer_seconds = pusher->tail_seconds();
    r.prefill_seconds = std::max(0.0, info.ttft_seconds - info.queue_seconds - r.transfer_seconds);
    r.kv_bytes = pusher->bytes_sent();
    res.set_content(r.ToJson(), "application/json");
  }

  void CountPushFailure(const KvPusher& pusher, const std::string& segment) {
    if (pusher.failure_state() == transfer::TransferState::kTimedOut) {
      transfer_timeouts_.fetch_add(1);
    } else {
      transfer_failures_.fetch_add(1);
    }
    DropSegment(segment);
  }

  // One stage of a pipelined prefill (protocol.h PipelineStage): this worker's layers of every
  // chunk, the previous stage's output in, the next stage's input out.
  void HandleStage(const PrefillCall& call, KvPusher& pusher, Clock::time_point deadline,
                   httplib::Response& res) {
    const PipelineStage& stage = call.stage;
    const int n_layers = engine_->config().n_layers;
    if (stage.end_layer > n_layers || stage.last() != (stage.end_layer == n_layers) ||
        (stage.index == 0) != (stage.begin_layer == 0)) {
      return ReplyError(
          res, InvalidArgument(fmt::format(
                   "stage {} of {} runs layers {}..{} of a model of {}: stages must "
                   "cover the layers in order",
                   stage.index, stage.stages, stage.begin_layer, stage.end_layer, n_layers)));
    }
    std::unique_ptr<httplib::Client> next;
    if (!stage.last()) {
      next = std::make_unique<httplib::Client>(stage.next_host, stage.next_port);
      next->set_keep_alive(true);
      SetHttpClientDeadline(*next, deadline);
    }
    auto send = [&](const StageInput& in) -> Status {
      const std::string body = in.Encode();
      const std::string peer = "pipeline stage " + stage.next_worker;
      ClusterCallHeaders signed_call = SignClusterCall("POST", "/v1/stage_input", body);
      auto r = next->Post("/v1/stage_input", signed_call.headers, body, "application/octet-stream");
      if (!r) return Unavailable(peer + " did not answer: " + httplib::to_string(r.error()));
      TANDEM_RETURN_IF_ERROR(CheckClusterReply(*r, signed_call.nonce, peer));
      if (r->status != 200) return StatusFromErrorJson(r->body, peer + " refused a chunk");
      return OkStatus();
    };
    auto notify = [&](const engine::SampledToken& t) {
      return KvReadyNotification(call.id, t.token, options_.name);
    };
    const StageRun run{call.id, stage.session, call.prompt_tokens, stage, call.sampling, deadline};
    const Clock::time_point started = Clock::now();
    auto outcome = RunPipelineStage(run, *backend_, pusher, stage_inbox_, send, notify);
    kv_bytes_pushed_.fetch_add(pusher.bytes_sent());
    if (!outcome.ok()) {
      if (pusher.failure_state() != transfer::TransferState::kCompleted) {
        CountPushFailure(pusher, call.target.segment);
      }
      log_->warn("{}: pipeline stage {} of {}: {}", call.id, stage.index, stage.stages,
                 outcome.status().ToString());
      return ReplyError(res, outcome.status());
    }
    PrefillResult r;
    r.first_token = outcome->first_token;
    r.transfer_seconds = pusher.tail_seconds();
    r.prefill_seconds = std::max(0.0, Seconds(Clock::now() - started) - r.transfer_seconds);
    r.kv_bytes = pusher.bytes_sent();
    r.stage_bytes_sent = outcome->bytes_sent;
    r.stage_wait_seconds = outcome->wait_seconds;
    log_->info(
        "{}: pipeline stage {} of {} (layers {}..{}, {} tokens in chunks of {}): {:.2f} s "
        "computing, {:.2f} s waiting for the previous stage, {:.1f} MiB to the next, {:.1f} MiB "
        "of KV",
        call.id, stage.index, stage.stages, stage.begin_layer, stage.end_layer,
        call.prompt_tokens.size(), stage.chunk_tokens, outcome->compute_seconds,
        outcome->wait_seconds, outcome->bytes_sent / 1048576.0, r.kv_bytes / 1048576.0);
    res.set_content(r.ToJson(), "application/json");
  }

  // ---- decode side ----

  struct Pending {
    serving::GenerationRequest request;
    std::shared_ptr<DecodeStream> stream;
    Clock::time_point kv_deadline;
  };

  void HandleDecode(const httplib::Request& req, httplib::Response& res)
      TANDEM_EXCLUDES(pending_mu_) {
    if (!CanDecode(role_.load())) {
      return ReplyError(res, FailedPrecondition("worker " + options_.name + " does not decode"));
    }
    auto call = DecodeCall::FromJson(req.body);
    if (!call.ok()) return ReplyError(res, call.status());
    const Clock::time_point now = Clock::now();
    serving::GenerationRequest g;
    g.id = call->id;
    g.prompt_tokens = call->prompt_tokens;
    g.max_tokens = call->max_tokens;
    g.ignore_eos = call->ignore_eos;
    g.sampling = call->sampling;
    g.resumed_output = call->resumed_output;
    g.arrival = now;
    g.deadline = now + std::chrono::milliseconds(call->timeout_ms);
    auto stream = std::make_shared<DecodeStream>();
    if (call->local) {
      if (Status st = backend_->Submit(std::move(g), std::make_shared<StreamSink>(stream, now));
          !st.ok()) {
        return ReplyError(res, st);
      }
    } else {
      const Clock::time_point kv_deadline =
          std::min(g.deadline, now + std::chrono::milliseconds(call->kv_wait_ms));
      const int n_prompt = static_cast<int>(g.prompt_tokens.size());
      // Only the blocks its prefix cache lacks are written by the prefill side.
      auto got = call->reuse_prefix
                     ? backend_->ReservePrompt(g.id, g.prompt_tokens, n_prompt + 1, kv_deadline)
                     : backend_->ReserveBlocks(g.id, n_prompt + 1, kv_deadline);
      if (!got.ok()) return ReplyError(res, got.status());
      DecodeEvent reserved;
      reserved.kind = DecodeEvent::Kind::kReserved;
      reserved.reserved.segment = segment_name_;
      reserved.reserved.blocks = std::move(got->blocks);
      reserved.reserved.skip_blocks = got->cached_blocks;
      reserved.reserved.window_blocks = std::move(got->window_blocks);
      reserved.reserved.window_arena_offset = engine_->kv().WindowArenaOffset();
      reserved.reserved.window_tokens = engine_->kv().shape().window_tokens;
      reserved.reserved.block_tokens = info_.block_tokens;
      reserved.reserved.n_layers = info_.n_layers;
      reserved.reserved.layer_slice_bytes = info_.layer_slice_bytes;
      reserved.reserved.decode_worker = options_.name;
      stream->Push(reserved);
      const std::string key = g.id;  // (the right side of `=` is evaluated first)
      MutexLock lock(&pending_mu_);
      pending_[key] = Pending{std::move(g), stream, kv_deadline};
    }
    const std::string id = call->id;
    // Counted until the response object goes (its releaser runs then, once).
    auto in_flight = std::make_shared<InFlight>(&decodes_in_flight_);
    res.set_chunked_content_provider(
        "application/x-ndjson",
        [this, stream, id](size_t, httplib::DataSink& out) {
          bool done = false;
          for (const std::string& line : stream->Take(std::chrono::milliseconds(100), &done)) {
            if (!out.write(line.data(), line.size())) {
              OnClientGone(id, *stream);
              return false;
            }
          }
          if (done) {
            out.done();
            return true;
          }
          if (out.is_writable && !out.is_writable()) {
            OnClientGone(id, *stream);
            return false;
          }
          ExpireKvWait(id);
          return true;
        },
        [this, stream, id, in_flight](bool success) {
          if (!success || !stream->done()) OnClientGone(id, *stream);
        });
  }

  void OnClientGone(const std::string& id, DecodeStream& stream) {
    stream.MarkClientGone();  // the sink cancels the running sequence at its next token
    CancelPending(id, Cancelled("the conductor went away"));
  }

  // Frees the reservation of a request still waiting for its KV.
  void CancelPending(const std::string& id, const Status& why) TANDEM_EXCLUDES(pending_mu_) {
    std::shared_ptr<DecodeStream> stream;
    {
      MutexLock lock(&pending_mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;
      stream = it->second.stream;
      pending_.erase(it);
    }
    backend_->CancelReservation(id);
    DecodeEvent e;
    e.kind = DecodeEvent::Kind::kError;
    e.error = why;
    stream->Push(e);
  }

  void ExpireKvWait(const std::string& id) TANDEM_EXCLUDES(pending_mu_) {
    {
      MutexLock lock(&pending_mu_);
      auto it = pending_.find(id);
      if (it == pending_.end() || Clock::now() < it->second.kv_deadline) return;
    }
    kv_wait_timeouts_.fetch_add(1);
    log_->warn("{}: its KV did not arrive in time; reservation freed", id);
    CancelPending(id, DeadlineExceeded("the KV cache did not arrive in time"));
  }

  // Transfer-engine thread: queue the hand-off, never block here.
  void OnNotification(const transfer::Notification& n) TANDEM_EXCLUDES(handoff_mu_) {
    {
      MutexLock lock(&handoff_mu_);
      handoffs_.push_back(n.message);
    }
    handoff_cv_.NotifyAll();
  }

  void HandoffLoop() TANDEM_EXCLUDES(handoff_mu_) {
    while (true) {
      std::string message;
      {
        MutexLock lock(&handoff_mu_);
        handoff_cv_.Wait(&handoff_mu_, [&] {
          handoff_mu_.AssertHeld();
          return handoff_stop_.load() || !handoffs_.empty();
        });
        if (handoff_stop_.load()) return;
        message = std::move(handoffs_.front());
        handoffs_.pop_front();
      }
      Handoff(message);
    }
  }

  // "kv_ready": the request's KV is in its reserved blocks; start decoding it.
  void Handoff(const std::string& message) TANDEM_EXCLUDES(pending_mu_) {
    std::string id;
    int32_t first_token = -1;
    try {
      const json j = json::parse(message);
      if (!JsonFloatsBounded(j)) return;
      if (j.at("kind").get<std::string>() != "kv_ready") return;
      id = j.at("id").get<std::string>();
      first_token = j.at("first_token").get<int32_t>();
    } catch (const std::exception& e) {
      log_->warn("ignoring a malformed notification: {}", e.what());
      return;
    }
    Pending p;
    {
      MutexLock lock(&pending_mu_);
      auto it = pending_.find(id);
      if (it == pending_.end()) return;  // cancelled or expired meanwhile
      p = std::move(it->second);
      pending_.erase(it);
    }
    auto sink = std::make_shared<StreamSink>(p.stream, Clock::now());
    if (Status st = backend_->SubmitPrefilled(std::move(p.request), first_token, sink); !st.ok()) {
      DecodeEvent e;
      e.kind = DecodeEvent::Kind::kError;
      e.error = st;
      p.stream->Push(e);
    }
  }

  // Set by Init() before the HTTP, hand-off and transfer-engine threads use them; then read-only
  // (te_, engine_ and backend_ are thread-safe themselves).
  WorkerOptions options_;
  std::shared_ptr<spdlog::logger> log_;
  std::shared_ptr<transfer::MetadataStore> metadata_;
  std::unique_ptr<transfer::TransferEngine> te_;
  std::string segment_name_;
  std::unique_ptr<engine::Engine> engine_;
  std::unique_ptr<store::PoolClient> pool_;  // outlives backend_, whose loop calls it
  std::string pool_namespace_;               // set with pool_, before the server starts
  std::unique_ptr<serving::LocalBackend> backend_;
  WorkerInfo info_;
  httplib::Server http_;
  int port_ = 0;

  Mutex segments_mu_;
  // Opened decode segments.
  std::map<std::string, transfer::SegmentHandle> segments_ TANDEM_GUARDED_BY(segments_mu_);

  StageInbox stage_inbox_;  // pipelined prefills: chunks from previous stages

  Mutex pending_mu_;
  // Decode side: reserved, waiting for KV.
  std::map<std::string, Pending> pending_ TANDEM_GUARDED_BY(pending_mu_);

  Mutex handoff_mu_;
  CondVar handoff_cv_;
  std::deque<std::string> handoffs_ TANDEM_GUARDED_BY(handoff_mu_);
  std::atomic<bool> handoff_stop_{false};  // set under handoff_mu_ (by the destructor)
  std::thread handoff_thread_;             // started by Init(), joined by the destructor

  // The role now (elastic pools: POST /v1/role changes it); read lock-free by the handlers.
  std::atomic<Role> role_{Role::kMixed};
  Mutex role_mu_;  // serialises role and thread changes and their publication
  int threads_ TANDEM_GUARDED_BY(role_mu_) = 0;  // the engine's thread count, as published
  std::map<int, conductor::CostModel> costs_;    // by thread count; fixed after Init
  std::atomic<int> prefills_in_flight_{0};
  std::atomic<int> decodes_in_flight_{0};  // decode streams being answered

  // Counters: lock-free.
  std::atomic<uint64_t> kv_bytes_pushed_{0};
  std::atomic<uint64_t> transfer_failures_{0};
  std::atomic<uint64_t> transfer_timeouts_{0};
  std::atomic<uint64_t> kv_wait_timeouts_{0};
};

}  // namespace

StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  auto w = std::make_unique<WorkerImpl>();
  TANDEM_RETURN_IF_ERROR(w->Init(options));
  return std::unique_ptr<Worker>(std::move(w));
}

}  // namespace tandem::cluster
