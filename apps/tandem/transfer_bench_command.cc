#include "transfer_bench_command.h"

namespace tandem::app {

CLI::App* AddTransferBenchCommand(CLI::App& app, bench::TransferBenchOptions& f) {
  CLI::App* cmd = app.add_subcommand(
      "transfer-bench",
      "Measure the transfer engine (GB/s, batch latency); loopback unless --segment is given");
  cmd->add_option("--mode", f.mode, "initiator (default) or target")
      ->check(CLI::IsMember({"initiator", "target"}));
  cmd->add_option("--protocol", f.protocol, "shm, tcp, ucx (if built) or memcpy (the limit)")
      ->check(CLI::IsMember({"shm", "tcp", "ucx", "memcpy"}));
  cmd->add_option("--operation", f.operation, "write (local -> remote) or read")
      ->check(CLI::IsMember({"read", "write"}));
  cmd->add_option("--block-size", f.block_size, "Bytes per request: 4096, 64KiB, 1MiB, 16MiB");
  cmd->add_option("--batch-size", f.batch_size, "Requests per batch")->check(CLI::Range(1, 4096));
  cmd->add_option("--threads", f.threads, "Initiator threads, one batch in flight each")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--duration", f.duration_s, "Measured seconds")->check(CLI::Range(0.001, 3600.0));
  cmd->add_option("--metadata", f.metadata,
                  "Metadata URI (embedded:NAME, http://HOST:PORT, etcd://HOST:PORT); default: "
                  "an HTTP server of this process for loopback runs");
  cmd->add_option("--segment", f.segment,
                  "Target segment name (initiator: use a running target; target: publish it)");
  cmd->add_option("--buffer-size", f.buffer_size,
                  "Segment bytes (default threads x batch x block, at most 256 MiB); initiator "
                  "and target must agree");
  cmd->add_option("--listen-host", f.listen_host, "Host of the data listener (target)");
  cmd->add_option("--lifetime", f.lifetime_s, "Target: exit after this many seconds (0: never)")
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_flag("--json", f.json, "Print one JSON object");
  return cmd;
}

}  // namespace tandem::app
