#include "structured/tool_call.h"

#include <nlohmann/json.hpp>

namespace tandem::structured {
namespace {

using nlohmann::json;

bool IsSpace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string_view TrimLeft(std::string_view s) {
  while (!s.empty() && IsSpace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  return s;
}

}  // namespace

std::string ToolCallSchema(const std::vector<ToolSpec>& tools) {
  json names = json::array(), variants = json::array();
  for (const ToolSpec& t : tools) {
    names.push_back(t.name);
    json params = json::parse(t.parameters_json, nullptr, /*allow_exceptions=*/false);
    if (params.is_discarded()) params = json::object();
    variants.push_back(std::move(params));
  }
  const json schema = {
      {"type", "object"},
      {"properties", {{"name", {{"enum", names}}}, {"arguments", {{"type", "object"}}}}},
      {"required", {"name", "arguments"}},
      {"additionalProperties", false},
      {"x-tandem-ordered", true},
      {"x-tandem-variants", {{"on", "name"}, {"property", "arguments"}, {"schemas", variants}}}};
  return schema.dump();
}

ToolCallMatcher::ToolCallMatcher(std::shared_ptr<const Schema> call_schema, bool required,
                                 int max_calls)
    : required_(required),
      max_calls_(max_calls),
      schema_(call_schema),
      json_(std::move(call_schema)) {}

bool ToolCallMatcher::Whitespace() { return ++ws_ <= kMaxWhitespaceRun; }

bool ToolCallMatcher::Feed(unsigned char c) {
  switch (phase_) {
    case Phase::kFree: return true;
    case Phase::kLead:
      if (IsSpace(c)) return Whitespace();
      ws_ = 0;
      if (c == static_cast<unsigned char>(kToolCallOpen[0])) {
        phase_ = Phase::kOpen;
        pos_ = 1;
        return true;
      }
      if (required_) return false;
      phase_ = Phase::kFree;
      return true;
    case Phase::kOpen:
      if (c == static_cast<unsigned char>(kToolCallOpen[pos_])) {
        if (++pos_ == kToolCallOpen.size()) phase_ = Phase::kJson;
        return true;
      }
      if (required_ || calls_ > 0) return false;
      phase_ = Phase::kFree;  // a message that begins like the tag
      return true;
    case Phase::kJson:
      if (!json_.Feed(c)) return false;
      if (json_.Closed() && !IsSpace(c)) {
        phase_ = Phase::kClose;
        pos_ = 0;
        ws_ = 0;
      }
      return true;
    case Phase::kClose:
      if (pos_ == 0 && IsSpace(c)) return Whitespace();
      if (c != static_cast<unsigned char>(kToolCallClose[pos_])) return false;
      if (++pos_ == kToolCallClose.size()) {
        phase_ = Phase::kDone;
        ws_ = 0;
        ++calls_;
      }
      return true;
    case Phase::kDone:
      if (IsSpace(c)) return Whitespace();
      if (calls_ >= max_calls_ || c != static_cast<unsigned char>(kToolCallOpen[0])) return false;
      phase_ = Phase::kOpen;  // the next call
      pos_ = 1;
      ws_ = 0;
      json_ = JsonMatcher(schema_);
      return true;
  }
  return false;
}

bool ToolCallMatcher::FeedAll(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

bool ToolCallMatcher::WouldAccept(std::string_view bytes, ToolCallMatcher* scratch) const {
  scratch->required_ = required_;
  scratch->max_calls_ = max_calls_;
  scratch->calls_ = calls_;
  scratch->schema_ = schema_;
  scratch->phase_ = phase_;
  scratch->pos_ = pos_;
  scratch->ws_ = ws_;
  json_.CopyStateTo(&scratch->json_);
  return scratch->FeedAll(bytes);
}

bool ToolCallMatcher::Complete() const {
  return phase_ == Phase::kFree || phase_ == Phase::kDone || (!required_ && phase_ == Phase::kLead);
}

std::optional<std::vector<ParsedToolCall>> ParseToolCalls(std::string_view text) {
  std::vector<ParsedToolCall> calls;
  for (text = TrimLeft(text); !text.empty(); text = TrimLeft(text)) {
    if (text.substr(0, kToolCallOpen.size()) != kToolCallOpen) return std::nullopt;
    text.remove_prefix(kToolCallOpen.size());
    // The call's JSON ends at the first close tag after which the text is whitespace or
    // another call (a close tag inside a JSON string does not end it, as the JSON won't parse).
    std::optional<json> call;
    size_t close = text.find(kToolCallClose);
    for (; close != std::string_view::npos; close = text.find(kToolCallClose, close + 1)) {
      json j = json::parse(text.substr(0, close), nullptr, /*allow_exceptions=*/false);
      if (!j.is_discarded()) {
        call = std::move(j);
        break;
      }
    }
    if (!call || !call->is_object()) return std::nullopt;
    auto name = call->find("name");
    auto args = call->find("arguments");
    if (name == call->end() || !name->is_string() || args == call->end() || !args->is_object()) {
      return std::nullopt;
    }
    calls.push_back({name->get<std::string>(), args->dump()});
    text.remove_prefix(close + kToolCallClose.size());
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

bool MayBeToolCall(std::string_view text) {
  text = TrimLeft(text);
  const size_t n = std::min(text.size(), kToolCallOpen.size());
  return text.substr(0, n) == kToolCallOpen.substr(0, n);
}

}  // namespace tandem::structured
