#include "bench/transfer_bench.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/subprocess.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace tandem::bench {
namespace {

using transfer::Clock;
using namespace std::chrono_literals;

constexpr uint64_t kMaxBlock = uint64_t{1} << 30;
constexpr uint64_t kDefaultBufferCap = uint64_t{256} << 20;  // default segment size cap, bytes
constexpr auto kBatchTimeout = 30s;   // per batch; a slower batch is an error
constexpr auto kTargetStartup = 15s;  // a spawned target publishes its segment by then
constexpr int kWarmupBatches = 3;     // per thread, not measured

int Fail(const std::string& message) {
  std::fprintf(stderr, "transfer-bench: error: %s\n", message.c_str());
  return 1;
}

struct Plan {
  transfer::OpCode op = transfer::OpCode::kWrite;
  uint64_t block = 0;   // bytes per request
  uint64_t buffer = 0;  // bytes of the remote segment (and of the local buffer)
  int batch = 0, threads = 0;
  double duration_s = 0;
};

StatusOr<Plan> MakePlan(const TransferBenchOptions& f) {
  Plan p;
  TANDEM_ASSIGN_OR_RETURN(p.block, ParseByteSize(f.block_size));
  if (f.batch_size < 1 || f.batch_size > 4096) {
    return InvalidArgument("--batch-size must be in [1, 4096]");
  }
  if (f.threads < 1 || f.threads > 256) return InvalidArgument("--threads must be in [1, 256]");
  if (!(f.duration_s > 0) || f.duration_s > 3600) {
    return InvalidArgument("--duration must be in (0, 3600] seconds");
  }
  p.batch = f.batch_size;
  p.threads = f.threads;
  p.duration_s = f.duration_s;
  p.op = f.operation == "read" ? transfer::OpCode::kRead : transfer::OpCode::kWrite;
  if (!f.buffer_size.empty()) {
    auto parsed = ParseByteSize(f.buffer_size);
    if (!parsed.ok()) return parsed.status().WithContext("--buffer-size");
    p.buffer = *parsed;
  } else {
    const uint64_t want = p.block * static_cast<uint64_t>(p.batch) * p.threads;
    p.buffer = std::min(want, std::max(kDefaultBufferCap, p.block));
  }
  if (p.buffer < p.block) return InvalidArgument("--buffer-size is smaller than one block");
  p.buffer -= p.buffer % p.block;  // whole blocks
  return p;
}

// Offset (bytes) of request i of thread t's batches: the threads' slots first, then wrapping.
uint64_t SlotOffset(const Plan& p, int thread, int i) {
  const uint64_t slots = p.buffer / p.block;
  return ((static_cast<uint64_t>(thread) * p.batch + i) % slots) * p.block;
}

struct Result {
  uint64_t bytes = 0, requests = 0, batches = 0;
  double elapsed_s = 0;
  std::vector<double> latencies_us;  // one per measured batch
};

double Percentile(std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(q * static_cast<double>(sorted.size() - 1) + 0.5);
  return sorted[std::min(rank, sorted.size() - 1)];
}

int Report(const TransferBenchOptions& f, const Plan& p, Result r) {
  std::sort(r.latencies_us.begin(), r.latencies_us.end());
  const double gbps = r.elapsed_s > 0 ? static_cast<double>(r.bytes) / r.elapsed_s / 1e9 : 0;
  const double p50 = Percentile(r.latencies_us, 0.50), p99 = Percentile(r.latencies_us, 0.99);
  double mean = 0;
  for (double v : r.latencies_us) mean += v;
  if (!r.latencies_us.empty()) mean /= static_cast<double>(r.latencies_us.size());
  if (f.json) {
    nlohmann::json j = {{"protocol", f.protocol}, {"operation", f.operation},
                        {"block_size", p.block},  {"batch_size", p.batch},
                        {"threads", p.threads},   {"duration_s", r.elapsed_s},
                        {"bytes", r.bytes},       {"requests", r.requests},
                        {"batches", r.batches},   {"gbps", gbps},
                        {"p50_us", p50},          {"p99_us", p99},
                        {"mean_us", mean},        {"latency_of", "batch"}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s %s: block %llu B x batch %d x %d thread(s), %.2f s\n", f.protocol.c_str(),
                f.operation.c_str(), static_cast<unsigned long long>(p.block), p.batch, p.threads,
                r.elapsed_s);
    std::printf("  throughput %.3f GB/s (%llu requests, %llu bytes)\n", gbps,
                static_cast<unsigned long long>(r.requests),
                static_cast<unsigned long long>(r.bytes));
    std::printf("  batch latency p50 %.1f us, p99 %.1f us, mean %.1f us\n", p50, p99, mean);
  }
  std::fflush(stdout);
  return 0;
}

// Page-aligned, zero-filled (touched, so page faults stay out of the measurement).
struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t size)
      : data(static_cast<char*>(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096))) {
    if (data != nullptr) std::memset(data, 0, size);
  }
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
};

// Runs body(thread, batch_index) on every thread, warm-up first, for the planned duration.
// body returns an error to stop the run.
template <typename Body>
StatusOr<Result> Measure(const Plan& p, Body body) {
  std::vector<std::vector<double>> lat(p.threads);
  std::vector<uint64_t> batches(p.threads, 0);
  std::vector<Status> errors(p.threads);
  std::atomic<int> warm{0};
  std::atomic<bool> go{false}, stop{false}, failed{false};
  Clock::time_point start, end;
  std::vector<std::thread> workers;
  for (int t = 0; t < p.threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < kWarmupBatches && errors[t].ok(); ++i) errors[t] = body(t);
      if (!errors[t].ok()) failed.store(true);
      warm.fetch_add(1);
      while (!go.load()) std::this_thread::sleep_for(100us);
      while (errors[t].ok() && !stop.load(std::memory_order_relaxed)) {
        const auto t0 = Clock::now();
        errors[t] = body(t);
        const auto t1 = Clock::now();
        if (!errors[t].ok()) {
          failed.store(true);
          break;
        }
        lat[t].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        ++batches[t];
      }
    });
  }
  while (warm.load() < p.threads) std::this_thread::sleep_for(1ms);
  start = Clock::now();
  go.store(true);
  const auto until = start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(p.duration_s));
  while (Clock::now() < until && !failed.load()) {
    std::this_thread::sleep_for(std::min<Clock::duration>(10ms, until - Clock::now()));
  }
  stop.store(true);
  for (auto& w : workers) w.join();
  end = Clock::now();
  for (const Status& e : errors) {
    if (!e.ok()) return e;
  }
  Result r;
  r.elapsed_s = std::chrono::duration<double>(end - start).count();
  for (int t = 0; t < p.threads; ++t) {
    r.batches += batches[t];
    r.latencies_us.insert(r.latencies_us.end(), lat[t].begin(), lat[t].end());
  }
  r.requests = r.batches * static_cast<uint64_t>(p.batch);
  r.bytes = r.requests * p.block;
  return r;
}

int RunMemcpy(const TransferBenchOptions& f, const Plan& p) {
  AlignedBuffer src(p.buffer), dst(p.buffer);
  if (src.data == nullptr || dst.data == nullptr) return Fail("out of memory for the buffers");
  const bool write = p.op == transfer::OpCode::kWrite;
  auto result = Measure(p, [&](int t) {
    for (int i = 0; i < p.batch; ++i) {
      const uint64_t off = SlotOffset(p, t, i);
      if (write) {
        std::memcpy(dst.data + off, src.data + off, p.block);
      } else {
        std::memcpy(src.data + off, dst.data + off, p.block);
      }
    }
    return OkStatus();
  });
  if (!result.ok()) return Fail(result.status().ToString());
  return Report(f, p, std::move(*result));
}

StatusOr<std::unique_ptr<transfer::TransferEngine>> MakeEngine(const TransferBenchOptions& f,
                                                               const std::string& role,
                                                               transfer::Protocol protocol,
                                                               int workers) {
  transfer::TransferEngineOptions o;
  o.local_name = "transfer-bench-" + role + "-" + std::to_string(getpid());
  TANDEM_ASSIGN_OR_RETURN(o.metadata, transfer::OpenMetadataStore(f.metadata));
  o.tcp_listen_host = f.listen_host;
  o.worker_threads = std::max(2, workers);
  o.protocols = {protocol};
  return transfer::TransferEngine::Create(std::move(o));
}

int RunTarget(const TransferBenchOptions& f, const Plan& p, transfer::Protocol protocol) {
  if (f.metadata.empty()) return Fail("--mode target needs --metadata");
  if (f.segment.empty()) return Fail("--mode target needs --segment");
  // SIGINT/SIGTERM are taken synchronously below; block them before engine threads start.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto engine = MakeEngine(f, "target", protocol, 2);
  if (!engine.ok()) return Fail(engine.status().ToString());
  auto segment = (*engine)->AllocateSegment(f.segment, p.buffer);
  if (!segment.ok()) return Fail(segment.status().ToString());
  // Written once, so that reads copy real pages (a never-written memfd page reads as the shared
  // zero page, which stays in cache and flatters read throughput).
  std::memset(*segment, 0xa5, p.buffer);
  std::printf("READY %s %llu\n", f.segment.c_str(), static_cast<unsigned long long>(p.buffer));
  std::fflush(stdout);
  const auto until = f.lifetime_s > 0
                         ? Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(f.lifetime_s))
                         : Clock::time_point::max();
  while (Clock::now() < until) {
    timespec ts{0, 200 * 1000 * 1000};
    if (sigtimedwait(&stop_signals, nullptr, &ts) > 0) break;
  }
  return 0;
}

// A target process of our own for loopback runs; stopped (SIGTERM, then SIGKILL) on destruction.
class SpawnedTarget {
 public:
  ~SpawnedTarget() { Stop(); }

  Status Start(const TransferBenchOptions& f, const Plan& p, const std::string& metadata,
               const std::string& segment) {
    // This binary again, as `tandem transfer-bench --mode target`.
    SpawnOptions o;
    o.argv = {"/proc/self/exe", "transfer-bench", "--mode", "target", "--protocol", f.protocol,
              "--metadata", metadata, "--segment", segment, "--buffer-size",
              std::to_string(p.buffer), "--listen-host", f.listen_host,
              // Bounded life even if this process vanishes without stopping it.
              "--lifetime", std::to_string(p.duration_s + 120)};
    o.death_signal = SIGTERM;
    o.unblock_signals = false;
    o.pipe_stdout = true;
    TANDEM_ASSIGN_OR_RETURN(Subprocess child, Spawn(o));
    pid_ = child.pid;
    const std::string line = ReadLine(child.stdout_fd, Clock::now() + kTargetStartup);
    close(child.stdout_fd);
    if (line.rfind("READY ", 0) != 0) {
      return Unavailable("the loopback target did not start (see its messages above)");
    }
    return OkStatus();
  }

  void Stop() {
    if (pid_ <= 0) return;
    StopProcess(pid_, SIGTERM, std::chrono::seconds(5));
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

int RunInitiator(TransferBenchOptions f, const Plan& p, transfer::Protocol protocol) {
  std::unique_ptr<transfer::MetadataHttpServer> server;
  SpawnedTarget target;
  if (f.segment.empty()) {
    if (f.metadata.empty()) {
      auto started = transfer::MetadataHttpServer::Start("127.0.0.1", 0);
      if (!started.ok()) return Fail(started.status().ToString());
      server = std::move(*started);
      f.metadata = "http://127.0.0.1:" + std::to_string(server->port());
    }
    f.segment = "transfer-bench-" + std::to_string(getpid()) + "/buffer";
    Status st = target.Start(f, p, f.metadata, f.segment);
    if (!st.ok()) return Fail(st.ToString());
  } else if (f.metadata.empty()) {
    return Fail("--segment needs --metadata (where the target published it)");
  }
  auto engine = MakeEngine(f, "initiator", protocol, p.threads);
  if (!engine.ok()) return Fail(engine.status().ToString());
  transfer::TransferEngine& te = **engine;
  auto handle = te.OpenSegment(f.segment);
  if (!handle.ok()) return Fail("open segment '" + f.segment + "': " + handle.status().ToString());
  auto used = te.SegmentProtocol(*handle);
  if (!used.ok() || *used != protocol) {
    return Fail("segment '" + f.segment + "' is not reachable over " + f.protocol +
                (used.ok() ? std::string(" (would use ") + transfer::ProtocolName(*used) + ")"
                           : ": " + used.status().ToString()));
  }
  AlignedBuffer local(p.buffer);
  if (local.data == nullptr) return Fail("out of memory for the local buffer");
  Status reg = te.RegisterLocalMemory(local.data, p.buffer);
  if (!reg.ok()) return Fail(reg.ToString());
  const transfer::SegmentHandle h = *handle;
  auto result = Measure(p, [&](int t) -> Status {
    std::vector<transfer::TransferRequest> batch(p.batch);
    for (int i = 0; i < p.batch; ++i) {
      const uint64_t off = SlotOffset(p, t, i);
      batch[i] = {p.op, local.data + off, h, off, p.block};
    }
    auto id = te.SubmitBatch(batch, Clock::now() + kBatchTimeout);
    if (!id.ok()) return id.status();
    const transfer::BatchStatus s = te.WaitBatch(*id);
    Status freed = te.FreeBatch(*id);
    if (s.state != transfer::TransferState::kCompleted) {
      const std::string what = std::string("batch ") + transfer::TransferStateName(s.state);
      return s.first_error.ok() ? Internal(what) : s.first_error.WithContext(what);
    }
    return freed;
  });
  (void)te.UnregisterLocalMemory(local.data);
  if (!result.ok()) return Fail(result.status().ToString());
  return Report(f, p, std::move(*result));
}

}  // namespace

StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  if (digits == 0 || digits > 12) {
    return InvalidArgument("bad size '" + text + "' (examples: 4096, 64KiB, 1MiB, 16MiB)");
  }
  const uint64_t n = std::stoull(text.substr(0, digits));
  std::string unit = text.substr(digits);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "k" || unit == "kib") scale = uint64_t{1} << 10;
  if (unit == "m" || unit == "mib") scale = uint64_t{1} << 20;
  if (unit == "g" || unit == "gib") scale = uint64_t{1} << 30;
  if (unit == "kb") scale = 1000;
  if (unit == "mb") scale = 1000 * 1000;
  if (unit == "gb") scale = 1000 * 1000 * 1000;
  if (scale == 0) {
    return InvalidArgument("bad size unit in '" + text + "' (use B, KiB, MiB, GiB, KB, MB, GB)");
  }
  if (n == 0 || n > kMaxBlock / scale) {
    return InvalidArgument("size '" + text + "' must be in [1 B, 1 GiB]");
  }
  return n * scale;
}

int RunTransferBench(const TransferBenchOptions& f) {
  auto plan = MakePlan(f);
  if (!plan.ok()) return Fail(plan.status().message());
  if (f.protocol == "memcpy") {
    if (f.mode == "target") return Fail("--protocol memcpy has no target");
    return RunMemcpy(f, *plan);
  }
  auto protocol = transfer::ParseProtocol(f.protocol);
  if (!protocol.ok()) return Fail(protocol.status().message());
#ifndef TANDEM_WITH_UCX
  if (*protocol == transfer::Protocol::kUcx) {
    return Fail("this tandem was built without UCX (configure with -DTANDEM_WITH_UCX=ON)");
  }
#endif
  if (f.mode == "target") return RunTarget(f, *plan, *protocol);
  return RunInitiator(f, *plan, *protocol);
}

}  // namespace tandem::bench
