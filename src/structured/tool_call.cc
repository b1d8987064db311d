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

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Removes leading whitespace and then `part` (nothing when part is empty); false when the text
// does not continue with it.
bool Consume(std::string_view* text, std::string_view part) {
  if (part.empty()) return true;
  *text = TrimLeft(*text);
  if (!StartsWith(*text, part)) return false;
  text->remove_prefix(part.size());
  return true;
}

// The JSON object `text` begins with (after whitespace), and its length: the shortest prefix
// ending in '}' that parses (a '}' inside a string leaves the prefix unparsable).
std::optional<json> LeadingObject(std::string_view* text) {
  *text = TrimLeft(*text);
  if (text->empty() || text->front() != '{') return std::nullopt;
  for (size_t close = text->find('}'); close != std::string_view::npos;
       close = text->find('}', close + 1)) {
    json j = json::parse(text->substr(0, close + 1), nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded()) {
      text->remove_prefix(close + 1);
      return j;
    }
  }
  return std::nullopt;
}

constexpr ToolCallSyntax kHermesSyntax{"", "", "<tool_call>", "</tool_call>", "", "", "arguments"};
constexpr ToolCallSyntax kLlama3JsonSyntax{"", "", "", "", ";", "", "parameters"};
constexpr ToolCallSyntax kMistralSyntax{"[TOOL_CALLS]", "[", "", "", ",", "]", "arguments"};

// The first literal part of an answer that calls ("{" where the syntax has none).
std::string_view LeadPart(const ToolCallSyntax& s) {
  for (std::string_view p : {s.begin, s.list_open, s.call_open}) {
    if (!p.empty()) return p;
  }
  return "{";
}

}  // namespace

const ToolCallSyntax& ToolCallSyntaxOf(ToolFormat format) {
  switch (format) {
    case ToolFormat::kLlama3Json: return kLlama3JsonSyntax;
    case ToolFormat::kMistral: return kMistralSyntax;
    case ToolFormat::kHermes: break;
  }
  return kHermesSyntax;
}

ToolFormat ToolFormatOfTemplate(std::string_view text) {
  if (text.find("[TOOL_CALLS]") != std::string_view::npos) return ToolFormat::kMistral;
  if (text.find("<tool_call>") != std::string_view::npos) return ToolFormat::kHermes;
  if (text.find("<|python_tag|>") != std::string_view::npos ||
      text.find("\"parameters\"") != std::string_view::npos) {
    return ToolFormat::kLlama3Json;
  }
  return ToolFormat::kHermes;
}

std::string_view ToolFormatName(ToolFormat format) {
  switch (format) {
    case ToolFormat::kLlama3Json: return "llama3_json";
    case ToolFormat::kMistral: return "mistral";
    case ToolFormat::kHermes: break;
  }
  return "hermes";
}

std::optional<ToolFormat> ToolFormatNamed(std::string_view name) {
  for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3Json, ToolFormat::kMistral}) {
    if (ToolFormatName(f) == name) return f;
  }
  return std::nullopt;
}

std::string ToolCallSchema(const std::vector<ToolSpec>& tools, std::string_view arguments_key) {
  json names = json::array(), variants = json::array();
  for (const ToolSpec& t : tools) {
    names.push_back(t.name);
    json params = json::parse(t.parameters_json, nullptr, /*allow_exceptions=*/false);
    if (params.is_discarded()) params = json::object();
    variants.push_back(std::move(params));
  }
  const std::string key(arguments_key);
  const json schema = {
      {"type", "object"},
      {"properties", {{"name", {{"enum", names}}}, {key, {{"type", "object"}}}}},
      {"required", {"name", key}},
      {"additionalProperties", false},
      {"x-tandem-ordered", true},
      {"x-tandem-variants", {{"on", "name"}, {"property", key}, {"schemas", variants}}}};
  return schema.dump();
}

ToolCallMatcher::ToolCallMatcher(std::shared_ptr<const Schema> call_schema, bool required,
                                 int max_calls, ToolFormat format)
    : required_(required),
      max_calls_(max_calls),
      syntax_(&ToolCallSyntaxOf(format)),
      schema_(call_schema),
      json_(std::move(call_schema)) {}

bool ToolCallMatcher::Whitespace() { return ++state_.ws <= kMaxWhitespaceRun; }

void ToolCallMatcher::Enter(Phase phase) {
  state_.phase = phase;
  state_.ws = 0;
  if (phase == Phase::kAfterCall) ++state_.calls;  // the call's last part is done
}

void ToolCallMatcher::StartLiterals(std::initializer_list<std::string_view> parts, Phase then) {
  state_.num_parts = 0;
  for (std::string_view p : parts) {
    if (!p.empty()) state_.parts[state_.num_parts++] = p;
  }
  state_.part = 0;
  state_.pos = 0;
  state_.after_literals = then;
  Enter(state_.num_parts == 0 ? then : Phase::kLiterals);
}

bool ToolCallMatcher::FeedLiteral(unsigned char c) {
  if (state_.pos == 0 && IsSpace(c)) return Whitespace();  // before or between parts
  const std::string_view part = state_.parts[state_.part];
  if (c != static_cast<unsigned char>(part[state_.pos])) {
    // Before the first call is certain, an answer that leaves the syntax is a message.
    if (required_ || state_.calls > 0 || state_.after_literals != Phase::kJson) return false;
    Enter(Phase::kFree);
    return true;
  }
  state_.ws = 0;
  if (++state_.pos < part.size()) return true;
  state_.pos = 0;
  if (++state_.part == state_.num_parts) Enter(state_.after_literals);
  return true;
}

bool ToolCallMatcher::StartJson(unsigned char c) {
  json_ = JsonMatcher(schema_);
  Enter(Phase::kJson);
  return json_.Feed(c);
}

bool ToolCallMatcher::Feed(unsigned char c) {
  const ToolCallSyntax& syn = *syntax_;
  switch (state_.phase) {
    case Phase::kFree: return true;
    case Phase::kLead:
      if (IsSpace(c)) return Whitespace();
      StartLiterals({syn.begin, syn.list_open, syn.call_open}, Phase::kJson);
      if (state_.phase == Phase::kLiterals) return FeedLiteral(c);
      if (c == '{') return StartJson(c);
      if (required_) return false;
      Enter(Phase::kFree);
      return true;
    case Phase::kLiterals: return FeedLiteral(c);
    case Phase::kJson:
      if (!json_.Feed(c)) return false;
      // The byte that closes the call's object ends the JSON; what follows is the syntax's.
      if (json_.Closed() && !IsSpace(c)) StartLiterals({syn.call_close}, Phase::kAfterCall);
      return true;
    case Phase::kAfterCall: {
      if (IsSpace(c)) return Whitespace();
      const std::string_view next = !syn.separator.empty() ? syn.separator : syn.call_open;
      if (!next.empty() && c == static_cast<unsigned char>(next[0])) {
        if (state_.calls >= max_calls_) return false;
        json_ = JsonMatcher(schema_);
        StartLiterals({syn.separator, syn.call_open}, Phase::kJson);
        return FeedLiteral(c);
      }
      if (!syn.end.empty() && c == static_cast<unsigned char>(syn.end[0])) {
        StartLiterals({syn.end}, Phase::kDone);
        return FeedLiteral(c);
      }
      return false;
    }
    case Phase::kDone: return IsSpace(c) && Whitespace();
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
  scratch->syntax_ = syntax_;
  scratch->schema_ = schema_;
  scratch->state_ = state_;
  json_.CopyStateTo(&scratch->json_);
  return scratch->FeedAll(bytes);
}

bool ToolCallMatcher::Complete() const {
  switch (state_.phase) {
    case Phase::kFree:
    case Phase::kDone: return true;
    case Phase::kAfterCall: return syntax_->end.empty();
    case Phase::kLead: return !required_;
    case Phase::kLiterals:
    case Phase::kJson: return false;
  }
  return false;
}

std::optional<std::vector<ParsedToolCall>> ParseToolCalls(std::string_view text,
                                                          ToolFormat format) {
  const ToolCallSyntax& syn = ToolCallSyntaxOf(format);
  std::vector<ParsedToolCall> calls;
  if (!Consume(&text, syn.begin) || !Consume(&text, syn.list_open)) return std::nullopt;
  while (true) {
    if (!Consume(&text, syn.call_open)) return std::nullopt;
    std::optional<json> call = LeadingObject(&text);
    if (!call) return std::nullopt;
    auto name = call->find("name");
    auto args = call->find(std::string(syn.arguments_key));
    if (args == call->end()) args = call->find("arguments");
    if (name == call->end() || !name->is_string() || args == call->end() || !args->is_object()) {
      return std::nullopt;
    }
    calls.push_back({name->get<std::string>(), args->dump()});
    if (!Consume(&text, syn.call_close)) return std::nullopt;
    text = TrimLeft(text);
    if (!syn.separator.empty() && StartsWith(text, syn.separator)) {
      text.remove_prefix(syn.separator.size());
    } else if (syn.separator.empty() && !syn.call_open.empty() && StartsWith(text, syn.call_open)) {
      continue;
    } else {
      break;
    }
  }
  if (!Consume(&text, syn.end) || !TrimLeft(text).empty()) return std::nullopt;
  return calls;
}

bool MayBeToolCall(std::string_view text, ToolFormat format) {
  text = TrimLeft(text);
  const std::string_view lead = LeadPart(ToolCallSyntaxOf(format));
  const size_t n = std::min(text.size(), lead.size());
  return text.substr(0, n) == lead.substr(0, n);
}

}  // namespace tandem::structured
