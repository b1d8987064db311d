// `tandem serve` starts workers with WorkerArgv: every field must come back through the worker's
// own flag parser, so that a knob added to WorkerFlags / WorkerKnobs reaches spawned workers.
#include "worker_flags.h"

#include <gtest/gtest.h>

namespace tandem::app {
namespace {

// Parses argv (after the subcommand) with the worker's flags.
WorkerFlags Parse(const std::vector<std::string>& args) {
  CLI::App app("test");
  WorkerFlags parsed;
  AddWorkerFlags(&app, parsed);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  app.parse(reversed);
  return parsed;
}

TEST(WorkerFlagsTest, ArgvParsesBackToTheSameFlags) {
  WorkerFlags f;
  f.role = "decode";
  f.name = "decode-3";
  f.metadata = "etcd://10.0.0.5:2379";
  f.model = "/models/m.gguf";
  f.host = "10.0.0.7";
  f.port = 4242;
  f.threads = 3;
  f.max_threads = 5;
  f.kv_cache_tokens = 12345;
  // Every knob away from its default (and doubles that print inexactly with %f).
  f.knobs.block_tokens = 32;
  f.knobs.max_num_seqs = 7;
  f.knobs.max_batch_tokens = 333;
  f.knobs.max_waiting = 9;
  f.knobs.drain_timeout_s = 0.1234567;
  f.knobs.transfer_protocols = "tcp";
  f.knobs.kv_transfer_timeout_s = 2.5e-2;
  f.knobs.cost_profile = "none";
  f.knobs.kv_pool = "off";
  f.knobs.pool_dram_mb = 17;
  f.knobs.pool_ssd_dir = "/var/tmp/kv blocks";
  f.knobs.pool_ssd_gb = 0.25;
  f.knobs.mock_profile = __FILE__;  // --mock takes an existing file
  ASSERT_FALSE(f == WorkerFlags{});
  EXPECT_TRUE(Parse(WorkerArgv(f)) == f);
}

TEST(WorkerFlagsTest, DefaultsSurviveTheRoundTrip) {
  WorkerFlags f;
  f.metadata = "http://127.0.0.1:1";  // the one required flag
  EXPECT_TRUE(Parse(WorkerArgv(f)) == f);
}

TEST(WorkerFlagsTest, ProtocolListsAreChecked) {
  auto ok = ParseProtocolList("shm,tcp");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->size(), 2u);
  EXPECT_EQ(ParseProtocolList("shm,carrier-pigeon").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseProtocolList("").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::app
