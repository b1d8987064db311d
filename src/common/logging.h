// One named spdlog logger per module: tandem::GetLogger("engine")->info(...).
// Logs go to stderr so that stdout stays for program output.
#pragma once

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace tandem {

std::shared_ptr<spdlog::logger> GetLogger(const std::string& name);
// "trace".."off"; unknown names leave the level unchanged and return false.
bool SetLogLevel(const std::string& level);

}  // namespace tandem
