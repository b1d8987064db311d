// Keeps child processes (the workers of `tandem serve`) alive: starts each with fork/exec,
// notices when one exits (waitpid), restarts it after a back-off, and stops them all on
// shutdown. Children get PR_SET_PDEATHSIG(SIGKILL), so they never outlive the supervisor.
//
// Thread-safety: Start, PidOf and restarts may be called from any thread, at once; StopAll (and
// so the destructor) from one thread at a time. One thread of the supervisor's own polls the
// children and restarts them; on_restart runs on it, without the supervisor's lock held (it may
// call the other methods, but not StopAll or the destructor, which join that thread).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace tandem::cluster {

struct ChildSpec {
  std::string name;               // unique among the children
  std::vector<std::string> argv;  // argv[0] is the program path
};

class Supervisor {
 public:
  // on_restart(name, exit description) is called on the supervisor's thread at each restart.
  explicit Supervisor(std::function<void(const std::string&, const std::string&)> on_restart,
                      std::chrono::milliseconds restart_backoff = std::chrono::milliseconds(500));
  ~Supervisor();  // StopAll with a short grace period

  // Starts the child and keeps it running until StopAll.
  Status Start(const ChildSpec& spec) TANDEM_EXCLUDES(mu_);
  // Stops a child for good (elastic pools give its cores back): SIGTERM now (it drains), SIGKILL
  // at `kill_at` if it is still there; never restarted; forgotten once reaped (its name may then
  // be started again). NotFound for an unknown name.
  Status Retire(const std::string& name, std::chrono::steady_clock::time_point kill_at)
      TANDEM_EXCLUDES(mu_);
  // Children started and not retired.
  int active() const TANDEM_EXCLUDES(mu_);
  // The child's current pid (0 while it is being restarted).
  pid_t PidOf(const std::string& name) const TANDEM_EXCLUDES(mu_);
  int restarts(const std::string& name) const TANDEM_EXCLUDES(mu_);
  // SIGTERM to every child, SIGKILL to those still alive at `deadline`; reaps them all.
  void StopAll(std::chrono::steady_clock::time_point deadline) TANDEM_EXCLUDES(mu_);

 private:
  struct Child {
    ChildSpec spec;
    pid_t pid = 0;
    int restarts = 0;
    std::chrono::steady_clock::time_point restart_at{};
    bool retiring = false;                            // Retire: reaped, never restarted
    std::chrono::steady_clock::time_point kill_at{};  // retiring: SIGKILL then
  };
  static StatusOr<pid_t> Spawn(const ChildSpec& spec);
  void Loop() TANDEM_EXCLUDES(mu_);

  std::function<void(const std::string&, const std::string&)> on_restart_;
  std::chrono::milliseconds backoff_;
  mutable Mutex mu_;
  std::map<std::string, Child> children_ TANDEM_GUARDED_BY(mu_);
  bool stopping_ TANDEM_GUARDED_BY(mu_) = false;
  // Not guarded: started by the constructor, joined by StopAll outside mu_ (joinable() is also
  // read under it); hence StopAll from one thread at a time.
  std::thread thread_;
};

}  // namespace tandem::cluster
