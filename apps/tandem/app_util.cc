#include "app_util.h"

#include <pthread.h>

#include <filesystem>
#include <thread>

namespace tandem::app {

std::string DefaultModelPath() {
  // Next to the binary's source tree first (build/tandem -> models/), then the working directory.
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string name = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!ec) {
    for (auto dir = exe.parent_path(); !dir.empty() && dir != dir.root_path();
         dir = dir.parent_path()) {
      if (std::filesystem::exists(dir / name)) return (dir / name).string();
    }
  }
  return name;
}

sigset_t BlockTerminationSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return signals;
}

int DefaultThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace tandem::app
