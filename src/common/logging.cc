#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "common/mutex.h"

namespace tandem {

std::shared_ptr<spdlog::logger> GetLogger(const std::string& name) {
  static Mutex mu;  // serializes get-or-create (spdlog's registry guards itself, not the pair)
  MutexLock lock(&mu);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_level(spdlog::get_level());
  return logger;
}

bool SetLogLevel(const std::string& level) {
  const auto parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") return false;
  spdlog::set_level(parsed);
  return true;
}

}  // namespace tandem
