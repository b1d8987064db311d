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

// What the answer may be: `required`: exactly one call; otherwise (OpenAI's "auto") either one
// call or a message, decided by the answer's first non-space byte ('<' begins the call's tag; a
// message that begins with '<' but not with the tag stays a message).
class ToolCallMatcher {
 public:
  ToolCallMatcher(std::shared_ptr<const Schema> call_schema, bool required);

  bool Feed(unsigned char c);
  bool FeedAll(std::string_view bytes);
  bool WouldAccept(std::string_view bytes, ToolCallMatcher* scratch) const;
  // The answer may end here (a whole call, or a message).
  bool Complete() const;
  // A whole call: nothing but whitespace may follow.
  bool Closed() const { return phase_ == Phase::kDone; }
  // A message: any byte may follow.
  bool Free() const { return phase_ == Phase::kFree; }

 private:
  enum class Phase : uint8_t { kLead, kOpen, kJson, kClose, kDone, kFree };
  bool Whitespace();  // one more whitespace byte outside the call's JSON: within the limit?

  bool required_;
  Phase phase_ = Phase::kLead;
  size_t pos_ = 0;  // bytes of the open or close tag matched
  int ws_ = 0;      // whitespace bytes in the current run outside the JSON
  JsonMatcher json_;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments_json;  // compact JSON text of the arguments object
};

// A finished answer that is one whole call (tags, JSON with a string "name" and an object
// "arguments", only whitespace around): the call; otherwise nullopt (a message).
std::optional<ParsedToolCall> ParseToolCall(std::string_view text);

// Whether an answer beginning with `text` may still turn out to be a call (its first
// non-whitespace bytes are a prefix of the open tag, or begin with it): a stream holds it back.
bool MayBeToolCall(std::string_view text);

}  // namespace tandem::structured
