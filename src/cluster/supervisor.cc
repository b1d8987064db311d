#include "cluster/supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "common/logging.h"
#include "common/subprocess.h"

namespace tandem::cluster {
namespace {

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

}  // namespace

Supervisor::Supervisor(std::function<void(const std::string&, const std::string&)> on_restart,
                       std::chrono::milliseconds restart_backoff)
    : on_restart_(std::move(on_restart)), backoff_(restart_backoff) {
  thread_ = std::thread([this] { Loop(); });
}

Supervisor::~Supervisor() { StopAll(std::chrono::steady_clock::now() + std::chrono::seconds(5)); }

StatusOr<pid_t> Supervisor::Spawn(const ChildSpec& spec) {
  if (spec.argv.empty()) return InvalidArgument("child '" + spec.name + "' has no program");
  SpawnOptions o;
  o.argv = spec.argv;
  o.death_signal = SIGKILL;  // die with the supervisor
  // Own process group: a Ctrl-C meant for the supervisor must not stop the workers before it
  // has drained them. Signals start unblocked (the parent blocks some for sigwait).
  o.own_process_group = true;
  o.unblock_signals = true;
  TANDEM_ASSIGN_OR_RETURN(Subprocess child, ::tandem::Spawn(o));
  return child.pid;
}

Status Supervisor::Start(const ChildSpec& spec) {
  MutexLock lock(&mu_);
  if (stopping_) return FailedPrecondition("the supervisor is stopping");
  if (children_.count(spec.name)) return InvalidArgument("child '" + spec.name + "' exists");
  TANDEM_ASSIGN_OR_RETURN(pid_t pid, Spawn(spec));
  children_[spec.name] = Child{spec, pid, 0, {}};
  return OkStatus();
}

Status Supervisor::Retire(const std::string& name, std::chrono::steady_clock::time_point kill_at) {
  MutexLock lock(&mu_);
  auto it = children_.find(name);
  if (it == children_.end() || it->second.retiring) return NotFound("no child '" + name + "'");
  Child& c = it->second;
  if (c.pid <= 0) {  // between a death and its restart: nothing to stop
    children_.erase(it);
    return OkStatus();
  }
  ::kill(c.pid, SIGTERM);
  c.retiring = true;
  c.kill_at = kill_at;
  return OkStatus();
}

int Supervisor::active() const {
  MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [name, c] : children_) n += c.retiring ? 0 : 1;
  return n;
}

pid_t Supervisor::PidOf(const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = children_.find(name);
  return it == children_.end() ? 0 : it->second.pid;
}

int Supervisor::restarts(const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = children_.find(name);
  return it == children_.end() ? 0 : it->second.restarts;
}

void Supervisor::Loop() {
  auto log = GetLogger("supervisor");
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::vector<std::pair<std::string, std::string>> restarted;
    {
      MutexLock lock(&mu_);
      if (stopping_) return;
      const auto now = std::chrono::steady_clock::now();
      for (auto it = children_.begin(); it != children_.end();) {
        Child& c = it->second;
        if (!c.retiring) {
          ++it;
          continue;
        }
        int status = 0;
        const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
        if (r == 0 && now < c.kill_at) {
          ++it;
          continue;
        }
        if (r == 0) {  // past its drain time
          ::kill(c.pid, SIGKILL);
          ::waitpid(c.pid, &status, 0);
        }
        log->info("worker {} (pid {}) retired: {}", it->first, c.pid, Describe(status));
        it = children_.erase(it);
      }
      for (auto& [name, c] : children_) {
        if (c.pid > 0) {
          int status = 0;
          const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
          if (r != c.pid) continue;
          log->warn("worker {} (pid {}) {}; restarting", name, c.pid, Describe(status));
          c.pid = 0;
          c.restart_at = now + backoff_;
          restarted.emplace_back(name, Describe(status));
        } else if (now >= c.restart_at) {
          auto pid = Spawn(c.spec);
          if (pid.ok()) {
            c.pid = *pid;
            c.restarts++;
          } else {
            log->error("cannot restart {}: {}", name, pid.status().ToString());
            c.restart_at = now + backoff_ * 4;
          }
        }
      }
    }
    for (const auto& [name, why] : restarted) {
      if (on_restart_) on_restart_(name, why);
    }
  }
}

void Supervisor::StopAll(std::chrono::steady_clock::time_point deadline) {
  {
    MutexLock lock(&mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  MutexLock lock(&mu_);
  for (auto& [name, c] : children_) {
    if (c.pid > 0) ::kill(c.pid, SIGTERM);
  }
  for (auto& [name, c] : children_) {
    while (c.pid > 0) {
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid || r < 0) {
        c.pid = 0;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, &status, 0);
        c.pid = 0;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

}  // namespace tandem::cluster
