// One named spdlog logger per module: tandem::GetLogger("engine")->info(...).
// Logs go to stderr so that stdout stays for program output.
#pragma once

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace tandem {

std::shared_ptr<spdlog::logger> GetLogger(const std::string& name);
// "trace".."off"; unknown names leave the level unchanged and return false.
bool SetLogLevel(const std::string& level);

}  // namespace tandem
