#include "server/stop_matcher.h"

#include <algorithm>

namespace tandem::server {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Result StopMatcher::Push(std::string_view piece) {
  Result r;
  if (stopped_) return r;
  if (stops_.empty()) {
    r.text.assign(piece);
    return r;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);

  // The earliest match wins (a stop string can only begin in the held part or the new piece).
  size_t first = std::string::npos;
  for (const std::string& s : stops_) first = std::min(first, buf.find(s));
  if (first != std::string::npos) {
    stopped_ = true;
    r.stopped = true;
    r.text = buf.substr(0, first);
    return r;
  }

  // Hold back the longest suffix of buf that is a proper prefix of a stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_len = std::min(s.size() - 1, buf.size());
    for (size_t len = max_len; len > hold; --len) {
      if (buf.compare(buf.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  r.text = buf.substr(0, buf.size() - hold);
  held_ = buf.substr(buf.size() - hold);
  return r;
}

std::string StopMatcher::Flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace tandem::server
