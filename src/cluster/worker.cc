// The worker's start-up, routes and stop (worker_impl_internal.h has the map of its files).
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/calibration.h"
#include "cluster/mock_step.h"
#include "cluster/worker_impl_internal.h"
#include "common/cluster_auth.h"
#include "common/http.h"

namespace tandem::cluster {
namespace worker_internal {

using nlohmann::json;

WorkerImpl::~WorkerImpl() {
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

Status WorkerImpl::Init(const WorkerOptions& o) {
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
  log_->info("worker {} ({}) on {}:{}; KV segment {} ({} blocks of {} tokens, {:.1f} MiB)", o.name,
             RoleName(o.role), o.host, port_, segment_name_, kv.num_blocks(),
             kv.shape().block_tokens, kv.SizeBytes() / 1048576.0);
  return OkStatus();
}

Status WorkerImpl::LoadCostModels(const WorkerOptions& o) {
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

conductor::CostModel WorkerImpl::CostAt(int threads) const {
  if (auto it = costs_.find(threads); it != costs_.end()) return it->second;
  auto start = costs_.find(options_.engine.threads);
  if (start == costs_.end()) return {};
  if (options_.mock_cost) return start->second;
  const double f = static_cast<double>(options_.engine.threads) / threads;
  conductor::CostModel scaled = start->second.Scaled(f, f);
  scaled.threads = threads;
  return scaled;
}

Status WorkerImpl::StartPool(int64_t incarnation, serving::SchedulerOptions* so) {
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
    TANDEM_RETURN_IF_ERROR(
        pool_->MountDram(o.name + "." + std::to_string(incarnation) + "/pool", o.pool_dram_bytes));
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

void WorkerImpl::Stop(Clock::time_point deadline) {
  (void)metadata_->Delete(std::string(kWorkersPrefix) + options_.name);
  backend_->Drain(deadline);
  http_.stop();
}

void WorkerImpl::Routes() {
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
  // Cluster calls (signed, body checked) answered by one of the Handle* methods.
  using Handler = void (WorkerImpl::*)(const httplib::Request&, httplib::Response&);
  auto post = [this](const char* path, Handler handler) {
    http_.Post(path, ClusterBodyChecked(
                         [this, handler](const httplib::Request& req, httplib::Response& res) {
                           (this->*handler)(req, res);
                         }));
  };
  post("/v1/prefill", &WorkerImpl::HandlePrefill);
  post("/v1/decode", &WorkerImpl::HandleDecode);
  post("/v1/role", &WorkerImpl::HandleRole);
  post("/v1/threads", &WorkerImpl::HandleThreads);
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

}  // namespace worker_internal

StatusOr<std::unique_ptr<Worker>> Worker::Start(const WorkerOptions& options) {
  auto w = std::make_unique<worker_internal::WorkerImpl>();
  TANDEM_RETURN_IF_ERROR(w->Init(options));
  return std::unique_ptr<Worker>(std::move(w));
}

}  // namespace tandem::cluster
