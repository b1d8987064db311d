// Tool calls (OpenAI "tools"): a model calls a function by answering
//
//   <tool_call>
//   {"name": "<function>", "arguments": {...}}
//   </tool_call>
//
// (the Hermes-style format SmolLM2 was trained on; docs/design/api.md). This file has the
// schema of one call, the byte matcher of a whole answer in tool mode, and the parser of a
// finished answer.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "structured/json_matcher.h"

namespace tandem::structured {

inline constexpr std::string_view kToolCallOpen = "<tool_call>";
inline constexpr std::string_view kToolCallClose = "</tool_call>";

struct ToolSpec {
  std::string name;             // [A-Za-z0-9_-]{1,64}
  std::string parameters_json;  // a JSON Schema of the arguments object
};

// The JSON Schema text of one call of any of `tools`: {"name": one of the names, "arguments":
// an object of that tool's parameters}, name first (x-tandem-ordered / x-tandem-variants).
std::string ToolCallSchema(const std::vector<ToolSpec>& tools);

// What the answer may be: `required`: calls only; otherwise (OpenAI's "auto") either calls or a
// message, decided by the answer's first non-space byte ('<' begins the call's tag; a message
// that begins with '<' but not with the tag stays a message). Calls: 1 to max_calls, each in
// its tags, separated by whitespace only (once one call is made, only another may follow).
class ToolCallMatcher {
 public:
  ToolCallMatcher(std::shared_ptr<const Schema> call_schema, bool required, int max_calls = 1);

  bool Feed(unsigned char c);
  bool FeedAll(std::string_view bytes);
  bool WouldAccept(std::string_view bytes, ToolCallMatcher* scratch) const;
  // The answer may end here (a whole call, or a message).
  bool Complete() const;
  // A whole call (the calls so far are whole).
  bool Closed() const { return phase_ == Phase::kDone; }
  int calls() const { return calls_; }
  // A message: any byte may follow.
  bool Free() const { return phase_ == Phase::kFree; }
  // JsonMatcher::PlainStringRoom of the call's JSON (0 outside it).
  size_t PlainStringRoom() const { return phase_ == Phase::kJson ? json_.PlainStringRoom() : 0; }

 private:
  enum class Phase : uint8_t { kLead, kOpen, kJson, kClose, kDone, kFree };
  bool Whitespace();  // one more whitespace byte outside the call's JSON: within the limit?

  bool required_;
  int max_calls_;
  int calls_ = 0;                         // whole calls so far
  std::shared_ptr<const Schema> schema_;  // of one call: each call's matcher starts from it
  Phase phase_ = Phase::kLead;
  size_t pos_ = 0;  // bytes of the open or close tag matched
  int ws_ = 0;      // whitespace bytes in the current run outside the JSON
  JsonMatcher json_;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments_json;  // compact JSON text of the arguments object
};

// A finished answer that is whole calls (each in its tags, JSON with a string "name" and an
// object "arguments", only whitespace around and between): the calls in order; otherwise
// nullopt (a message).
std::optional<std::vector<ParsedToolCall>> ParseToolCalls(std::string_view text);

// Whether an answer beginning with `text` may still turn out to be a call (its first
// non-whitespace bytes are a prefix of the open tag, or begin with it): a stream holds it back.
bool MayBeToolCall(std::string_view text);

}  // namespace tandem::structured
