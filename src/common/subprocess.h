// Starting child processes: one fork/exec for the supervisor of worker processes, the transfer
// benchmark's target and the tests' peers. The child closes nothing it was not told to, execs
// `argv[0]` (a path: no PATH search), and reports an exec failure as exit status 127.
//
//   SpawnOptions o;
//   o.argv = {"/proc/self/exe", "worker", "--role", "decode"};
//   o.pipe_stdout = true;
//   TANDEM_ASSIGN_OR_RETURN(Subprocess child, Spawn(o));
//   std::string line = ReadLine(child.stdout_fd, deadline);
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace tandem {

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the program's path
  // Sent to the child when the spawning thread's process dies (PR_SET_PDEATHSIG); 0: none.
  int death_signal = 0;
  // A process group of its own: a Ctrl-C meant for the parent does not reach the child.
  bool own_process_group = false;
  // The child starts with no signal blocked (the parent often blocks SIGINT/SIGTERM for sigwait).
  bool unblock_signals = true;
  bool pipe_stdin = false;   // Subprocess::stdin_fd writes to the child's stdin
  bool pipe_stdout = false;  // Subprocess::stdout_fd reads the child's stdout
  // The child's stdout and stderr appended to this file (ignored for stdout when piped).
  std::string output_file;
  // Set in the child's environment (on top of this process's).
  std::vector<std::pair<std::string, std::string>> env;
};

// A started child: its pid and the parent's ends of the pipes asked for (-1 otherwise), which
// the caller owns (close them). Not waited for: the caller reaps it (waitpid) or lets
// StopProcess do it.
struct Subprocess {
  pid_t pid = -1;
  int stdin_fd = -1;
  int stdout_fd = -1;
};

// InvalidArgument for an empty argv, Internal when pipe() or fork() fails.
StatusOr<Subprocess> Spawn(const SpawnOptions& options);

// Reads from fd until a newline or until `deadline`; returns the line without it, or "" on
// EOF, error or timeout. Reads in chunks: bytes after the newline are dropped (for children
// that print one line of start-up information).
std::string ReadLine(int fd, std::chrono::steady_clock::time_point deadline);

// Sends `signal` to pid, waits for it up to `grace`, then SIGKILLs and reaps it. Returns the
// wait status (as waitpid gives it), or -1 if pid was not a child of this process.
int StopProcess(pid_t pid, int signal, std::chrono::milliseconds grace);

}  // namespace tandem
