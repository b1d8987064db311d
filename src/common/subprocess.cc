#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace tandem {
namespace {

// A pipe whose ends close on exec (the child dup2s the end it keeps onto 0 or 1).
Status MakePipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0) return Internal(std::string("pipe: ") + std::strerror(errno));
  return OkStatus();
}

void CloseIfOpen(int fd) {
  if (fd >= 0) ::close(fd);
}

}  // namespace

StatusOr<Subprocess> Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return InvalidArgument("no program to start");
  int in[2] = {-1, -1}, out[2] = {-1, -1};
  if (o.pipe_stdin) TANDEM_RETURN_IF_ERROR(MakePipe(in));
  if (o.pipe_stdout) {
    if (Status st = MakePipe(out); !st.ok()) {
      CloseIfOpen(in[0]);
      CloseIfOpen(in[1]);
      return st;
    }
  }
  // Everything the child needs is prepared before fork (no allocation after it).
  std::vector<char*> args;
  for (const auto& a : o.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment, built here too: setenv after fork could deadlock on a lock another thread
  // of the parent held at fork time.
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool replaced = false;
    for (const auto& kv : o.env) replaced |= entry.rfind(kv.first + "=", 0) == 0;
    if (!replaced) env_text.push_back(entry);
  }
  for (const auto& [name, value] : o.env) env_text.push_back(name + "=" + value);
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string exec_failed = "cannot start " + o.argv[0] + "\n";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int err = errno;
    for (int fd : {in[0], in[1], out[0], out[1]}) CloseIfOpen(fd);
    return Internal(std::string("fork: ") + std::strerror(err));
  }
  if (pid == 0) {
    if (o.death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, o.death_signal);
      if (::getppid() != parent) ::_exit(1);  // the parent died before prctl
    }
    if (o.own_process_group) ::setpgid(0, 0);
    if (o.unblock_signals) {
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
    }
    if (!o.output_file.empty()) {
      const int fd = ::open(o.output_file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        if (!o.pipe_stdout) ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
        ::close(fd);
      }
    }
    if (o.pipe_stdin) ::dup2(in[0], STDIN_FILENO);
    if (o.pipe_stdout) ::dup2(out[1], STDOUT_FILENO);
    ::execve(args[0], args.data(), envp.data());
    (void)!::write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    ::_exit(127);
  }
  Subprocess child;
  child.pid = pid;
  if (o.pipe_stdin) {
    ::close(in[0]);
    child.stdin_fd = in[1];
  }
  if (o.pipe_stdout) {
    ::close(out[1]);
    child.stdout_fd = out[0];
  }
  return child;
}

std::string ReadLine(int fd, std::chrono::steady_clock::time_point deadline) {
  std::string line;
  while (line.find('\n') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return "";
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left.count(), 200)));
    if (ready < 0 && errno != EINTR) return "";
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) return "";  // EOF: the child exited (or closed its stdout)
    line.append(buf, static_cast<size_t>(n));
  }
  line.resize(line.find('\n'));
  return line;
}

int StopProcess(pid_t pid, int signal, std::chrono::milliseconds grace) {
  if (pid <= 0) return -1;
  ::kill(pid, signal);
  const auto until = std::chrono::steady_clock::now() + grace;
  int status = 0;
  while (std::chrono::steady_clock::now() < until) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  return ::waitpid(pid, &status, 0) == pid ? status : -1;
}

}  // namespace tandem
