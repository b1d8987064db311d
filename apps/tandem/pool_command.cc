#include "pool_command.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>

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

}  // namespace

CLI::App* AddPoolMasterCommand(CLI::App& app, PoolMasterFlags& f) {
  CLI::App* cmd = app.add_subcommand(
      "pool-master",
      "Run the KV pool's master on its own (several hosts): found by workers through the "
      "metadata service; stands by while another master is published");
  cmd->add_option("--metadata", f.metadata, "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
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
  cmd->add_option("--metadata", f.metadata, "Metadata service: http://HOST:PORT or etcd://HOST:PORT")
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
  auto names = ParseProtocolList(f.transfer_protocols);
  if (!names.ok()) return Fail("--transfer-protocols", names.status());
  auto metadata = transfer::OpenMetadataStore(f.metadata);
  if (!metadata.ok()) return Fail("metadata service " + f.metadata, metadata.status());
  const std::string name = f.name.empty() ? "store-" + std::to_string(::getpid()) : f.name;
  transfer::TransferEngineOptions to;
  to.local_name = name + "." + std::to_string(::getpid());
  to.metadata = *metadata;
  to.tcp_listen_host = f.host;
  to.protocols.clear();
  for (const auto& n : *names) to.protocols.push_back(*transfer::ParseProtocol(n));
  auto te = transfer::TransferEngine::Create(to);
  if (!te.ok()) return Fail("transfer engine", te.status());
  store::PoolClientOptions po;
  po.metadata = *metadata;
  po.engine = te->get();
  po.node = name;
  auto pool = store::PoolClient::Create(po);
  if (!pool.ok()) return Fail("pool client", pool.status());
  // The segment's name changes with every start: objects a dead incarnation held never
  // resolve to the new, empty memory.
  const std::string segment =
      name + "." + std::to_string(std::chrono::duration_cast<milliseconds>(
                                      std::chrono::system_clock::now().time_since_epoch())
                                      .count()) +
      "/pool";
  if (Status st = (*pool)->MountDram(segment, static_cast<uint64_t>(f.dram_mb) << 20); !st.ok()) {
    return Fail("pool segment", st);
  }
  std::printf("store %s: %d MiB in segment %s\n", name.c_str(), f.dram_mb, segment.c_str());
  std::fflush(stdout);
  while (!Signalled(signals, milliseconds(1000))) {
  }
  log->info("store {} stopping", name);
  pool->reset();  // unmounts
  return 0;
}

}  // namespace tandem::app
