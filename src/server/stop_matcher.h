// Applies OpenAI `stop` strings to a stream of decoded text so that no part of a stop string is
// ever emitted: text that could be the beginning of a stop string is held back until the next
// piece shows whether it is one.
//
//   StopMatcher m({"\n\n", "END"});
//   auto r = m.Push("Hello E");   // r.text == "Hello ", "E" held back
//   r = m.Push("ND more");        // r.text == "", r.stopped == true
//
// Text must be valid UTF-8 (as model::StreamDecoder produces); held-back text then always
// starts at a character boundary, so emitted pieces are valid UTF-8 too. Not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

class StopMatcher {
 public:
  // Empty strings in `stops` are ignored.
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched; `text` is what precedes it
  };
  // Appends a piece. After a match, further pushes return nothing.
  Result Push(std::string_view piece);
  // Returns the held-back text at the end of generation (empty after a match).
  std::string Flush();

  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // a suffix of the text so far that is a proper prefix of some stop string
  bool stopped_ = false;
};

}  // namespace tandem::server
