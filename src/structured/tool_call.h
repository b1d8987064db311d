// Tool calls (OpenAI "tools"): a model calls a function by answering in the format its chat
// template taught it (docs/design/api.md "Call formats"):
//
//   kHermes (Qwen, Hermes, and the generic format offered to templates without tools):
//     <tool_call>
//     {"name": "<function>", "arguments": {...}}
//     </tool_call>                                   (one block per call)
//   kLlama3Json (Llama 3.1+): {"name": "<function>", "parameters": {...}}   (calls joined by ';')
//   kMistral:                 [TOOL_CALLS] [{"name": "<function>", "arguments": {...}}, ...]
//
// This file has each format's syntax, the schema of one call, the byte matcher of a whole answer
// in tool mode, the parser of a finished answer, and the choice of format for a chat template.
#pragma once

#include <array>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "engine/sampling_params.h"
#include "structured/json_matcher.h"

namespace tandem::structured {

using ToolFormat = engine::SamplingParams::ToolFormat;

// The bytes around the calls of one answer. An answer that calls is
//   begin list_open call_open CALL call_close (separator call_open CALL call_close)* end
// where CALL is one call's JSON object and empty parts are absent; whitespace (a run of at most
// kMaxWhitespaceRun bytes) may stand between any two parts and at both ends. The first bytes of
// `separator` (or, when it is empty, of `call_open`) and of `end` differ, so the byte after a call
// says which follows. All views point at static strings.
struct ToolCallSyntax {
  std::string_view begin;
  std::string_view list_open;
  std::string_view call_open;
  std::string_view call_close;
  std::string_view separator;
  std::string_view end;
  std::string_view arguments_key;  // the call object's key of the arguments object
};

const ToolCallSyntax& ToolCallSyntaxOf(ToolFormat format);

// The format a chat template asks for, read from its text: "[TOOL_CALLS]" → kMistral;
// "<tool_call>" → kHermes; "<|python_tag|>" or a literal "parameters" key → kLlama3Json;
// otherwise kHermes. Templates that do not read `tools` get our generic (kHermes) offer.
ToolFormat ToolFormatOfTemplate(std::string_view template_text);

// "hermes", "llama3_json", "mistral" (the names --tool-call-format takes).
std::string_view ToolFormatName(ToolFormat format);
std::optional<ToolFormat> ToolFormatNamed(std::string_view name);

struct ToolSpec {
  std::string name;             // [A-Za-z0-9_-]{1,64}
  std::string parameters_json;  // a JSON Schema of the arguments object
};

// The JSON Schema text of one call of any of `tools`: {"name": one of the names, <arguments_key>:
// an object of that tool's parameters}, name first (x-tandem-ordered / x-tandem-variants).
std::string ToolCallSchema(const std::vector<ToolSpec>& tools,
                           std::string_view arguments_key = "arguments");

// What the answer may be: `required`: calls only; otherwise (OpenAI's "auto") either calls or a
// message. In auto mode the answer's first non-space bytes decide: while they follow the
// syntax's leading parts (begin, list_open, call_open; or '{' where all are empty) it is a call,
// and the first byte that does not makes it a message (so a message may begin with '<' or '[').
// Calls: 1 to max_calls, in `syntax`; once one call is made, only the syntax may follow.
class ToolCallMatcher {
 public:
  ToolCallMatcher(std::shared_ptr<const Schema> call_schema, bool required, int max_calls = 1,
                  ToolFormat format = ToolFormat::kHermes);

  bool Feed(unsigned char c);
  bool FeedAll(std::string_view bytes);
  bool WouldAccept(std::string_view bytes, ToolCallMatcher* scratch) const;
  // The answer may end here (whole calls, or a message).
  bool Complete() const;
  // The calls so far are whole (the last call's JSON and close are done).
  bool Closed() const { return state_.phase == Phase::kAfterCall || state_.phase == Phase::kDone; }
  // Nothing but the end may follow: the syntax's end is matched, or (where it has none) the last
  // allowed call is whole.
  bool Ended() const {
    return state_.phase == Phase::kDone || (state_.phase == Phase::kAfterCall &&
                                            syntax_->end.empty() && state_.calls >= max_calls_);
  }
  int calls() const { return state_.calls; }
  // A message: any byte may follow.
  bool Free() const { return state_.phase == Phase::kFree; }
  // JsonMatcher::PlainStringRoom of the call's JSON (0 outside it).
  size_t PlainStringRoom() const {
    return state_.phase == Phase::kJson ? json_.PlainStringRoom() : 0;
  }

 private:
  enum class Phase : uint8_t { kLead, kLiterals, kJson, kAfterCall, kDone, kFree };
  // Everything but the JSON matcher: copied whole by WouldAccept.
  struct State {
    Phase phase = Phase::kLead;
    Phase after_literals = Phase::kJson;      // where kLiterals goes when its parts are matched
    std::array<std::string_view, 3> parts{};  // the literal parts to match, in order
    uint8_t num_parts = 0, part = 0;
    uint32_t pos = 0;  // bytes of parts[part] matched
    int ws = 0;        // whitespace bytes in the current run outside the JSON
    int calls = 0;     // whole calls so far
  };
  bool Whitespace();  // one more whitespace byte outside the call's JSON: within the limit?
  void Enter(Phase phase);
  void StartLiterals(std::initializer_list<std::string_view> parts, Phase then);
  bool FeedLiteral(unsigned char c);
  bool StartJson(unsigned char c);  // c is the first byte of a call's JSON

  bool required_;
  int max_calls_;
  const ToolCallSyntax* syntax_;
  std::shared_ptr<const Schema> schema_;  // of one call: each call's matcher starts from it
  State state_;
  JsonMatcher json_;
};

struct ParsedToolCall {
  std::string name;
  std::string arguments_json;  // compact JSON text of the arguments object
};

// A finished answer that is whole calls in `format` (each a JSON object with a string "name" and
// an object under the syntax's arguments key — or "arguments", which every format accepts —
// other keys ignored; only the syntax and whitespace around and between): the calls in order;
// otherwise nullopt (a message).
std::optional<std::vector<ParsedToolCall>> ParseToolCalls(std::string_view text,
                                                          ToolFormat format = ToolFormat::kHermes);

// Whether an answer beginning with `text` may still turn out to be a call (its first
// non-whitespace bytes are a prefix of the format's first literal part, or begin with it; '{'
// where the format has none): a stream holds it back.
bool MayBeToolCall(std::string_view text, ToolFormat format = ToolFormat::kHermes);

}  // namespace tandem::structured
