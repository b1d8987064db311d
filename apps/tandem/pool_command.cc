#include "pool_command.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "app_util.h"
#include "common/logging.h"
#include "flags.h"
#include "store/pool.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"
#include "worker_flags.h"

namespace tandem::app {
namespace {

using std::chrono::milliseconds;

// Waits up to `wait` for SIGTERM/SIGINT; true if one came.
bool Signalled(const sigset_t& signals, milliseconds wait) {
  const timespec ts{static_cast<time_t>(wait.count() / 1000),
                    static_cast<long>((wait.count() % 1000) * 1000000)};
  return sigtimedwait(&signals, nullptr, &ts) > 0;
}

int Fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "error: %s: %s\n", what.c_str(), st.ToString().c_str());
  return 1;
}

// A pool client with a transfer engine of its own (members destroyed in reverse order: the
// client before the engine it uses).
struct PoolNode {
  std::shared_ptr<transfer::MetadataStore> metadata;
  std::unique_ptr<transfer::TransferEngine> engine;
  std::unique_ptr<store::PoolClient> pool;
};

StatusOr<PoolNode> ConnectPoolNode(const std::string& metadata_uri, const std::string& engine_name,
                                   const std::string& node, const std::string& host,
                                   const std::string& protocols) {
  TANDEM_ASSIGN_OR_RETURN(auto names, ParseProtocolList(protocols));
  PoolNode n;
  TANDEM_ASSIGN_OR_RETURN(n.metadata, transfer::OpenMetadataStore(metadata_uri));
  transfer::TransferEngineOptions to;
  to.local_name = engine_name;
  to.metadata = n.metadata;
  to.tcp_listen_host = host;
  to.protocols.clear();
  for (const auto& name : names) to.protocols.push_back(*transfer::ParseProtocol(name));
  TANDEM_ASSIGN_OR_RETURN(n.engine, transfer::TransferEngine::Create(to));
  store::PoolClientOptions po;
  po.metadata = n.metadata;
  po.engine = n.engine.get();
  po.node = node;
  TANDEM_ASSIGN_OR_RETURN(n.pool, store::PoolClient::Create(po));
  return n;
}

}  // namespace

CLI::App* AddPoolMasterCommand(CLI::App& app, PoolMasterFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "pool-master",
      "Run the KV pool's master on its own (several hosts): found by workers through the "
      "metadata service; stands by while another master is published");
  cmd->add_option("--metadata", f.metadata,
                  "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
      ->required();
  cmd->add_option("--host", f.host, "Address to listen on (and to publish)")->capture_default_str();
  cmd->add_option("--port", f.port, "Port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--journal", f.journal,
                  "Keep the master's state in the metadata service, so that a restarted master or "
                  "a standby knows every stored block (on, off)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  cmd->add_option("--hot-gets", f.hot_gets,
                  "Reads after which a block gets one more replica on another node (0: never)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-replicas", f.max_replicas, "Most replicas of a hot block")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  AddClusterTokenFlag(cmd, f.cluster_token_file);
  return cmd;
}

int RunPoolMaster(const PoolMasterFlags& f) {
  auto log = GetLogger("pool");
  const sigset_t signals = BlockTerminationSignals();
  if (!SetUpClusterToken(f.cluster_token_file, /*generate=*/false)) return 2;
  auto metadata = transfer::OpenMetadataStore(f.metadata);
  if (!metadata.ok()) return Fail("metadata service " + f.metadata, metadata.status());
  store::PoolMasterOptions o;
  o.journal = f.journal == "on";
  o.policy.hot_gets = f.hot_gets;
  o.policy.max_replicas = f.max_replicas;

  // Stand by while another master is published; its key goes when its lease lapses (it died)
  // or it unpublishes (it stopped). The metadata service's leases are the only arbiter.
  bool announced = false;
  for (;;) {
    auto current = (*metadata)->Get(store::kMasterKey);
    if (!current.ok()) break;
    if (!announced) {
      log->info("a pool master is published at {}: standing by", *current);
      announced = true;
    }
    if (Signalled(signals, milliseconds(250))) return 0;
  }
  auto master = store::PoolMasterServer::Start(f.host, f.port, o, *metadata);
  if (!master.ok()) return Fail("pool master", master.status());
  std::printf("pool master on %s (journal %s)\n", (*master)->uri().c_str(), f.journal.c_str());
  std::fflush(stdout);
  while (!Signalled(signals, milliseconds(1000))) {
    // Another master won a race for the key (two standbys at once): this one steps down.
    auto current = (*metadata)->Get(store::kMasterKey);
    if (current.ok() && *current != (*master)->uri()) {
      log->warn("pool master {} replaced by {}: stepping down", (*master)->uri(), *current);
      return 1;
    }
  }
  log->info("pool master {} stopping", (*master)->uri());
  return 0;
}

CLI::App* AddStoreCommand(CLI::App& app, StoreFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "store", "Contribute DRAM to the KV pool without an engine (a storage node)");
  cmd->add_option("--metadata", f.metadata,
                  "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
      ->required();
  cmd->add_option("--name", f.name, "Unique name in the cluster (default: store-<pid>)");
  cmd->add_option("--host", f.host, "Address of the data listener")->capture_default_str();
  cmd->add_option("--dram-mb", f.dram_mb, "Shared memory contributed to the pool")
      ->check(CLI::Range(1, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--transfer-protocols", f.transfer_protocols,
                  "Transfer protocols by preference (shm, tcp, ucx)")
      ->capture_default_str();
  AddClusterTokenFlag(cmd, f.cluster_token_file);
  return cmd;
}

int RunStore(const StoreFlags& f) {
  auto log = GetLogger("pool");
  const sigset_t signals = BlockTerminationSignals();
  if (!SetUpClusterToken(f.cluster_token_file, /*generate=*/false)) return 2;
  const std::string name = f.name.empty() ? "store-" + std::to_string(::getpid()) : f.name;
  auto node = ConnectPoolNode(f.metadata, name + "." + std::to_string(::getpid()), name, f.host,
                              f.transfer_protocols);
  if (!node.ok()) return Fail("store " + name, node.status());
  auto& pool = node->pool;
  // The segment's name changes with every start: objects a dead incarnation held never
  // resolve to the new, empty memory.
  const std::string segment =
      name + "." +
      std::to_string(std::chrono::duration_cast<milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count()) +
      "/pool";
  if (Status st = pool->MountDram(segment, static_cast<uint64_t>(f.dram_mb) << 20); !st.ok()) {
    return Fail("pool segment", st);
  }
  std::printf("store %s: %d MiB in segment %s\n", name.c_str(), f.dram_mb, segment.c_str());
  std::fflush(stdout);
  while (!Signalled(signals, milliseconds(1000))) {
  }
  log->info("store {} stopping", name);
  pool.reset();  // unmounts
  return 0;
}

CLI::App* AddPoolBenchCommand(CLI::App& app, PoolBenchFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "pool-bench", "Measure fetches from the KV pool (GB/s, batch latency) through its master");
  cmd->add_option("--metadata", f.metadata,
                  "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
      ->required();
  cmd->add_option("--host", f.host, "Address of this client's data listener")
      ->capture_default_str();
  cmd->add_option("--transfer-protocols", f.transfer_protocols,
                  "Transfer protocols by preference (shm, tcp, ucx)")
      ->capture_default_str();
  cmd->add_option("--block-size", f.block_bytes, "Bytes per object")
      ->check(CLI::Range(uint64_t{64}, uint64_t{1} << 30))
      ->capture_default_str();
  cmd->add_option("--batch-size", f.batch, "Objects per lookup")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_option("--objects", f.objects, "Objects stored and read in turn")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--duration", f.duration_s, "Measured seconds")
      ->check(CLI::Range(0.01, 3600.0))
      ->capture_default_str();
  cmd->add_flag("--json", f.json, "Print one JSON object");
  AddClusterTokenFlag(cmd, f.cluster_token_file);
  return cmd;
}

int RunPoolBench(const PoolBenchFlags& f) {
  if (!SetUpClusterToken(f.cluster_token_file, /*generate=*/false)) return 2;
  if (f.objects < f.batch) {
    std::fprintf(stderr, "error: --objects must be at least --batch-size\n");
    return 2;
  }
  const std::string name = "pool-bench-" + std::to_string(::getpid());
  auto node = ConnectPoolNode(f.metadata, name, name, f.host, f.transfer_protocols);
  if (!node.ok()) return Fail("pool-bench", node.status());
  transfer::TransferEngine* te = node->engine.get();
  store::PoolClient* pool = node->pool.get();

  // Sources: every object, distinct bytes; destinations: one batch.
  const uint64_t block = f.block_bytes;
  std::vector<uint8_t> src(block * static_cast<uint64_t>(f.objects));
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (auto& b : src) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  std::vector<uint8_t> dst(block * static_cast<uint64_t>(f.batch));
  for (auto* buf : {&src, &dst}) {
    if (Status st = te->RegisterLocalMemory(buf->data(), buf->size()); !st.ok()) {
      return Fail("register memory", st);
    }
  }
  std::vector<std::string> keys;
  for (int i = 0; i < f.objects; ++i) keys.push_back(store::ObjectKey(name, uint64_t(i)));
  auto ptrs = [](std::vector<uint8_t>& buf, uint64_t block, int begin, int end) {
    std::vector<void*> p;
    for (int i = begin; i < end; ++i) p.push_back(buf.data() + block * static_cast<uint64_t>(i));
    return p;
  };
  const auto deadline = [] { return std::chrono::steady_clock::now() + std::chrono::seconds(10); };
  for (int i = 0; i < f.objects; i += f.batch) {
    const int end = std::min(f.objects, i + f.batch);
    auto stored = pool->Put(std::vector<std::string>(keys.begin() + i, keys.begin() + end),
                            ptrs(src, block, i, end), block, deadline());
    if (!stored.ok()) return Fail("put", stored.status());
    if (*stored != end - i) {
      std::fprintf(stderr, "error: the pool stored %d of %d objects (no segment with room?)\n",
                   *stored, end - i);
      return 1;
    }
  }
  // Lookups of whole batches, cycling through the objects.
  std::vector<double> latencies_us;
  uint64_t bytes = 0;
  const int groups = f.objects / f.batch;
  const auto start = std::chrono::steady_clock::now();
  const auto stop = start + std::chrono::duration<double>(f.duration_s);
  for (int g = 0; std::chrono::steady_clock::now() < stop; g = (g + 1) % groups) {
    const int begin = g * f.batch;
    const auto t0 = std::chrono::steady_clock::now();
    auto got = pool->GetPrefix(
        std::vector<std::string>(keys.begin() + begin, keys.begin() + begin + f.batch),
        ptrs(dst, block, 0, f.batch), block, deadline());
    const auto t1 = std::chrono::steady_clock::now();
    if (!got.ok()) return Fail("get", got.status());
    if (*got != f.batch) {
      std::fprintf(stderr, "error: a lookup read %d of %d objects\n", *got, f.batch);
      return 1;
    }
    bytes += block * static_cast<uint64_t>(*got);
    latencies_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (std::memcmp(dst.data(),
                  src.data() +
                      block * static_cast<uint64_t>(
                                  ((static_cast<int>(latencies_us.size()) - 1) % groups) * f.batch),
                  dst.size()) != 0) {
    std::fprintf(stderr, "error: the bytes read differ from the bytes stored\n");
    return 1;
  }
  (void)pool->Remove(keys, deadline());
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double q) {
    return latencies_us[std::min(
        latencies_us.size() - 1,
        static_cast<size_t>(q * static_cast<double>(latencies_us.size())))];
  };
  const double gbps = static_cast<double>(bytes) / seconds / 1e9;
  // The reads' share of a lookup (the rest: the master's answer): mean microseconds per batch.
  const store::PoolClientStats ps = pool->Stats();
  const double read_us = ps.fetch_seconds * 1e6 / static_cast<double>(ps.get_calls);
  if (f.json) {
    std::printf(
        "{\"block_size\":%llu,\"batch_size\":%d,\"batches\":%zu,\"bytes\":%llu,"
        "\"duration_s\":%.3f,\"gbps\":%.3f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
        "\"read_mean_us\":%.1f,\"protocols\":\"%s\"}\n",
        static_cast<unsigned long long>(block), f.batch, latencies_us.size(),
        static_cast<unsigned long long>(bytes), seconds, gbps, pct(0.5), pct(0.99), read_us,
        f.transfer_protocols.c_str());
  } else {
    std::printf(
        "%zu lookups of %d x %llu B in %.2f s: %.3f GB/s, p50 %.1f us, p99 %.1f us (reads and "
        "checksums: %.1f us per lookup on average)\n",
        latencies_us.size(), f.batch, static_cast<unsigned long long>(block), seconds, gbps,
        pct(0.5), pct(0.99), read_us);
  }
  for (auto* buf : {&src, &dst}) (void)te->UnregisterLocalMemory(buf->data());
  return 0;
}

}  // namespace tandem::app
