#include "server/openai_request.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "server/openai_tools.h"
#include "structured/json_schema.h"
#include "structured/tool_call.h"

namespace tandem::server {
namespace {

using nlohmann::json;

const char* TypeName(const json& v) {
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

ApiError WrongType(const std::string& field, const char* expected, const json& v) {
  return ApiError::BadRequest("'" + field + "' must be " + expected + ", got " + TypeName(v),
                              field);
}

ApiError Unsupported(const std::string& field, const std::string& what) {
  return ApiError::BadRequest("'" + field + "': " + what + " is not supported by this server",
                              field);
}

// The value of `key` when present and not null, else nullptr.
const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<ApiError> GetBool(const json& body, const char* key, bool* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return WrongType(key, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

// A number within [lo, hi] (NaN/inf cannot come from JSON).
std::optional<ApiError> GetNumber(const json& body, const char* key, double lo, double hi,
                                  std::optional<double>* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return WrongType(key, "a number", *v);
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi)) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "'%s' must be between %g and %g, got %g", key, lo, hi, d);
    return ApiError::BadRequest(buf, key);
  }
  *out = d;
  return std::nullopt;
}

// An integer within [lo, hi].
std::optional<ApiError> GetInt(const json& body, const char* key, int64_t lo, int64_t hi,
                               std::optional<int64_t>* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) return WrongType(key, "an integer", *v);
  bool in_range;
  int64_t value = 0;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    in_range =
        (lo <= 0 || u >= static_cast<uint64_t>(lo)) && hi >= 0 && u <= static_cast<uint64_t>(hi);
    value = in_range ? static_cast<int64_t>(u) : 0;
  } else {
    value = v->get<int64_t>();
    in_range = value >= lo && value <= hi;
  }
  if (!in_range) {
    const std::string got = v->dump();
    return ApiError::BadRequest("'" + std::string(key) + "' must be between " + std::to_string(lo) +
                                    " and " + std::to_string(hi) + ", got " + got,
                                key);
  }
  *out = value;
  return std::nullopt;
}

std::optional<ApiError> ParseStop(const json& body, std::vector<std::string>* out) {
  const json* v = Field(body, "stop");
  if (v == nullptr) return std::nullopt;
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 4) {
      return ApiError::BadRequest(
          "'stop' may hold at most 4 sequences, got " + std::to_string(v->size()), "stop");
    }
    for (const json& s : *v) {
      if (!s.is_string()) return WrongType("stop", "a string or an array of strings", s);
      stops.push_back(s.get<std::string>());
    }
  } else {
    return WrongType("stop", "a string or an array of strings", *v);
  }
  for (auto& s : stops) {
    if (s.size() > 1024)
      return ApiError::BadRequest("'stop' sequences must be at most 1024 bytes", "stop");
    if (!s.empty()) out->push_back(std::move(s));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& body, std::vector<model::ChatMessage>* out) {
  const json* v = Field(body, "messages");
  if (v == nullptr) return ApiError::BadRequest("'messages' is required", "messages");
  if (!v->is_array()) return WrongType("messages", "an array", *v);
  if (v->empty()) return ApiError::BadRequest("'messages' must not be empty", "messages");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(where, "an object", m);
    const json* role = Field(m, "role");
    if (role == nullptr)
      return ApiError::BadRequest("'" + where + ".role' is required", where + ".role");
    if (!role->is_string()) return WrongType(where + ".role", "a string", *role);
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant" && r != "tool") {
      return ApiError::BadRequest("'" + where +
                                      ".role' must be one of system, developer, user, "
                                      "assistant, tool; got '" +
                                      role->get<std::string>() + "'",
                                  where + ".role");
    }
    const json* content = Field(m, "content");
    std::string text;
    if (content == nullptr) {
      if (r != "assistant") {
        return ApiError::BadRequest("'" + where + ".content' is required", where + ".content");
      }
    } else if (content->is_string()) {
      text = content->get<std::string>();
    } else if (content->is_array()) {
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pw = where + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return WrongType(pw, "an object", part);
        const json* type = Field(part, "type");
        if (type == nullptr || !type->is_string()) {
          return ApiError::BadRequest("'" + pw + ".type' must be a string", pw + ".type");
        }
        if (type->get<std::string>() != "text") {
          return Unsupported(pw + ".type",
                             "content of type '" + type->get<std::string>() + "' (only 'text')");
        }
        const json* t = Field(part, "text");
        if (t == nullptr || !t->is_string()) {
          return ApiError::BadRequest("'" + pw + ".text' must be a string", pw + ".text");
        }
        if (k > 0) text += "\n";
        text += t->get<std::string>();
      }
    } else {
      return WrongType(where + ".content", "a string or an array of content parts", *content);
    }
    std::vector<model::ChatToolCall> calls_out;
    if (const json* calls = Field(m, "tool_calls")) {
      if (r != "assistant") {
        return ApiError::BadRequest("'" + where + ".tool_calls' is for assistant messages",
                                    where + ".tool_calls");
      }
      if (!calls->is_array()) return WrongType(where + ".tool_calls", "an array", *calls);
      for (size_t k = 0; k < calls->size(); ++k) {
        const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        const json& call = (*calls)[k];
        const json* fn = call.is_object() ? Field(call, "function") : nullptr;
        const json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
        const json* args = fn != nullptr && fn->is_object() ? Field(*fn, "arguments") : nullptr;
        if (name == nullptr || !name->is_string()) {
          return ApiError::BadRequest("'" + cw + ".function.name' must be a string",
                                      cw + ".function.name");
        }
        json args_value = json::object();
        if (args != nullptr) {
          if (!args->is_string()) return WrongType(cw + ".function.arguments", "a string", *args);
          args_value = json::parse(args->get<std::string>(), nullptr, false);
          if (args_value.is_discarded() || !args_value.is_object()) {
            return ApiError::BadRequest(
                "'" + cw + ".function.arguments' must be a JSON object in a string",
                cw + ".function.arguments");
          }
        }
        const json* id = Field(call, "id");
        calls_out.push_back({id != nullptr && id->is_string() ? id->get<std::string>() : "",
                             name->get<std::string>(),
                             args != nullptr ? args->get<std::string>() : "{}"});  // order kept
      }
    }
    std::string tool_call_id;
    if (const json* id = Field(m, "tool_call_id");
        id != nullptr && id->is_string() && r == "tool") {
      tool_call_id = id->get<std::string>();
    }
    out->push_back({std::move(r), std::move(text), std::move(calls_out), std::move(tool_call_id)});
  }
  return std::nullopt;
}

std::optional<ApiError> ParseTokenIds(const json& arr, std::vector<int32_t>* out) {
  for (const json& t : arr) {
    const bool ok =
        t.is_number_integer() &&
        (t.is_number_unsigned() ? t.get<uint64_t>() <= INT32_MAX
                                : t.get<int64_t>() >= 0 && t.get<int64_t>() <= INT32_MAX);
    if (!ok) {
      return ApiError::BadRequest("'prompt' token ids must be non-negative integers", "prompt");
    }
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// A string, an array of token ids, or an array of several of either (one prompt each).
std::optional<ApiError> ParsePrompt(const json& body, int max_prompts, ParsedRequest* out) {
  const json* v = Field(body, "prompt");
  if (v == nullptr) return ApiError::BadRequest("'prompt' is required", "prompt");
  const char* kExpected =
      "a string, an array of token ids, or an array of strings or of token-id arrays";
  if (v->is_string()) {
    out->prompts.push_back({v->get<std::string>(), {}});
    return std::nullopt;
  }
  if (!v->is_array()) return WrongType("prompt", kExpected, *v);
  if (v->empty()) return ApiError::BadRequest("'prompt' must not be empty", "prompt");
  const json& first = (*v)[0];
  if (first.is_number()) {
    out->prompts.emplace_back();
    return ParseTokenIds(*v, &out->prompts.back().token_ids);
  }
  if (static_cast<int>(v->size()) > max_prompts) {
    return ApiError::BadRequest("'prompt' may hold at most " + std::to_string(max_prompts) +
                                    " prompts, got " + std::to_string(v->size()),
                                "prompt");
  }
  for (const json& p : *v) {
    out->prompts.emplace_back();
    if (p.is_string()) {
      out->prompts.back().text = p.get<std::string>();
    } else if (p.is_array()) {
      if (p.empty()) return ApiError::BadRequest("'prompt' must not be empty", "prompt");
      if (auto e = ParseTokenIds(p, &out->prompts.back().token_ids)) return e;
    } else {
      return WrongType("prompt", kExpected, p);
    }
  }
  return std::nullopt;
}

// OpenAI's {"<token id>": bias} map.
std::optional<ApiError> ParseLogitBias(const json& body, engine::SamplingParams* out) {
  const json* v = Field(body, "logit_bias");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return WrongType("logit_bias", "an object", *v);
  if (v->size() > 1024) {
    return ApiError::BadRequest("'logit_bias' may name at most 1024 tokens", "logit_bias");
  }
  for (const auto& [key, value] : v->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX) {
      return ApiError::BadRequest(
          "'logit_bias' keys must be token ids (non-negative integers), got '" + key + "'",
          "logit_bias");
    }
    if (!value.is_number()) return WrongType("logit_bias." + key, "a number", value);
    const double bias = value.get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return ApiError::BadRequest("'logit_bias' values must be between -100 and 100, got " +
                                      value.dump() + " for token " + key,
                                  "logit_bias");
    }
    out->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  return std::nullopt;
}

std::optional<ApiError> ParseStopTokenIds(const json& body, engine::SamplingParams* out) {
  const json* v = Field(body, "stop_token_ids");
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return WrongType("stop_token_ids", "an array of token ids", *v);
  if (v->size() > 1024) {
    return ApiError::BadRequest("'stop_token_ids' may hold at most 1024 ids", "stop_token_ids");
  }
  for (const json& t : *v) {
    const bool ok = t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() <= INT32_MAX;
    if (!ok) {
      return ApiError::BadRequest("'stop_token_ids' must hold non-negative integers",
                                  "stop_token_ids");
    }
    out->stop_token_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// Chat: logprobs (boolean) and top_logprobs (0..20, only with logprobs); completions: logprobs
// (0..20). Sets sampling.logprobs (-1: none).
std::optional<ApiError> ParseLogprobs(const json& body, Endpoint endpoint,
                                      engine::SamplingParams* out) {
  const int64_t most = engine::kMaxLogprobs;
  if (endpoint == Endpoint::kChatCompletions) {
    bool logprobs = false;
    if (auto e = GetBool(body, "logprobs", &logprobs)) return e;
    std::optional<int64_t> top;
    if (auto e = GetInt(body, "top_logprobs", 0, most, &top)) return e;
    if (top && !logprobs) {
      return ApiError::BadRequest("'top_logprobs' needs 'logprobs' set to true", "top_logprobs");
    }
    out->logprobs = logprobs ? static_cast<int>(top.value_or(0)) : -1;
    return std::nullopt;
  }
  const json* v = Field(body, "logprobs");
  if (v != nullptr && v->is_boolean()) {  // some clients send false for "none"
    if (v->get<bool>()) return WrongType("logprobs", "an integer", *v);
    return std::nullopt;
  }
  std::optional<int64_t> n;
  if (auto e = GetInt(body, "logprobs", 0, most, &n)) return e;
  if (n) out->logprobs = static_cast<int>(*n);
  return std::nullopt;
}

// Penalties, logit_bias, min_tokens, stop_token_ids, logprobs; n, best_of, echo.
std::optional<ApiError> ParseOutputControls(const json& body, Endpoint endpoint,
                                            const ProtocolLimits& limits, ParsedRequest* out) {
  engine::SamplingParams& s = out->sampling;
  for (auto [key, target] : {std::pair{"presence_penalty", &s.presence_penalty},
                             std::pair{"frequency_penalty", &s.frequency_penalty}}) {
    std::optional<double> d;
    if (auto e = GetNumber(body, key, -2.0, 2.0, &d)) return e;
    if (d) *target = static_cast<float>(*d);
  }
  std::optional<double> rep;
  if (auto e = GetNumber(body, "repetition_penalty", 0.0, 10.0, &rep)) return e;
  if (rep) {
    if (*rep <= 0.0) {
      return ApiError::BadRequest("'repetition_penalty' must be greater than 0",
                                  "repetition_penalty");
    }
    s.repetition_penalty = static_cast<float>(*rep);
  }
  if (auto e = ParseLogitBias(body, &s)) return e;
  std::optional<int64_t> i;
  if (auto e = GetInt(body, "min_tokens", 0, limits.max_model_len, &i)) return e;
  if (i) s.min_tokens = static_cast<int>(*i);
  if (auto e = ParseStopTokenIds(body, &s)) return e;
  if (auto e = ParseLogprobs(body, endpoint, &s)) return e;
  i.reset();
  if (auto e = GetInt(body, "n", 1, limits.max_n, &i)) return e;
  if (i) out->n = static_cast<int>(*i);
  i.reset();
  if (auto e = GetInt(body, "best_of", 1, std::numeric_limits<int>::max(), &i)) return e;
  if (i && *i != out->n) return Unsupported("best_of", "best_of other than n");
  if (endpoint == Endpoint::kCompletions) {
    if (auto e = GetBool(body, "echo", &out->echo)) return e;
    // echo with logprobs: the prompt's tokens are scored too.
    if (out->echo) s.prompt_logprobs = s.logprobs;
  }
  return std::nullopt;
}

uint64_t RandomSeed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

// tools, tool_choice, parallel_tool_calls (chat). Sets out->tools (the tools offered, empty
// under tool_choice "none") and, for a call, sampling.json_schema / tool_mode.
// body_text: the body as sent, for the tools' parameters in their key order (the order chat
// templates show them in; `body` sorts keys).
std::optional<ApiError> ParseTools(const json& body, std::string_view body_text, Endpoint endpoint,
                                   engine::SamplingParams::ToolFormat format, ParsedRequest* out) {
  if (const json* v = Field(body, "functions")) {
    if (!v->is_array()) return WrongType("functions", "an array", *v);
    if (!v->empty()) return Unsupported("functions", "the deprecated 'functions' (use 'tools')");
  }
  const json* tools = Field(body, "tools");
  const json* choice = Field(body, "tool_choice");
  if (tools == nullptr || (tools->is_array() && tools->empty())) {
    if (choice != nullptr && !(choice->is_string() && choice->get<std::string>() == "none")) {
      return ApiError::BadRequest("'tool_choice' needs 'tools'", "tool_choice");
    }
    return std::nullopt;
  }
  if (!tools->is_array()) return WrongType("tools", "an array", *tools);
  if (endpoint != Endpoint::kChatCompletions)
    return Unsupported("tools", "tools on /v1/completions");
  if (tools->size() > 128)
    return ApiError::BadRequest("'tools' may hold at most 128 tools", "tools");
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body_text.begin(), body_text.end(), nullptr, false);
  std::vector<ToolDefinition> defs;
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string where = "tools[" + std::to_string(i) + "]";
    const json& t = (*tools)[i];
    const json* type = t.is_object() ? Field(t, "type") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "function") {
      return ApiError::BadRequest("'" + where + ".type' must be \"function\"", where + ".type");
    }
    const json* fn = Field(t, "function");
    if (fn == nullptr || !fn->is_object()) {
      return ApiError::BadRequest("'" + where + ".function' must be an object",
                                  where + ".function");
    }
    const json* name = Field(*fn, "name");
    const bool name_ok =
        name != nullptr && name->is_string() && !name->get<std::string>().empty() &&
        name->get<std::string>().size() <= 64 &&
        std::all_of(name->get_ref<const std::string&>().begin(),
                    name->get_ref<const std::string&>().end(), [](char c) {
                      return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
                    });
    if (!name_ok) {
      return ApiError::BadRequest(
          "'" + where + ".function.name' must be 1-64 letters, digits, '_' or '-'",
          where + ".function.name");
    }
    ToolDefinition d;
    d.name = name->get<std::string>();
    for (const auto& other : defs) {
      if (other.name == d.name) {
        return ApiError::BadRequest("'tools' names '" + d.name + "' twice", "tools");
      }
    }
    if (const json* desc = Field(*fn, "description")) {
      if (!desc->is_string()) return WrongType(where + ".function.description", "a string", *desc);
      d.description = desc->get<std::string>();
    }
    json params = {{"type", "object"}, {"properties", json::object()}};
    if (const json* p = Field(*fn, "parameters")) {
      if (!p->is_object()) return WrongType(where + ".function.parameters", "an object", *p);
      params = *p;
    }
    d.parameters_json = params.dump();
    d.parameters_ordered_json = d.parameters_json;
    if (Field(*fn, "parameters") != nullptr && !ordered.is_discarded()) {
      d.parameters_ordered_json = ordered.at("tools").at(i).at("function").at("parameters").dump();
    }
    if (auto compiled = structured::CompileSchema(d.parameters_json); !compiled.ok()) {
      return ApiError::BadRequest(
          "'" + where + ".function.parameters': " + compiled.status().message(),
          where + ".function.parameters");
    }
    defs.push_back(std::move(d));
  }
  using ToolMode = engine::SamplingParams::ToolMode;
  ToolMode mode = ToolMode::kAuto;
  std::vector<ToolDefinition> callable = defs;
  if (choice != nullptr) {
    if (choice->is_string()) {
      const std::string c = choice->get<std::string>();
      if (c == "none") return std::nullopt;  // no tools offered, a plain answer
      if (c == "required") {
        mode = ToolMode::kRequired;
      } else if (c != "auto") {
        return ApiError::BadRequest(
            "'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}",
            "tool_choice");
      }
    } else if (choice->is_object()) {
      const json* fn = Field(*choice, "function");
      const json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
      if (name == nullptr || !name->is_string()) {
        return ApiError::BadRequest("'tool_choice.function.name' must be a string",
                                    "tool_choice.function.name");
      }
      callable.clear();
      for (const auto& d : defs) {
        if (d.name == name->get<std::string>()) callable.push_back(d);
      }
      if (callable.empty()) {
        return ApiError::BadRequest(
            "'tool_choice' names '" + name->get<std::string>() + "', which 'tools' does not list",
            "tool_choice.function.name");
      }
      mode = ToolMode::kRequired;
    } else {
      return WrongType("tool_choice", "a string or an object", *choice);
    }
  }
  bool parallel = true;
  if (auto e = GetBool(body, "parallel_tool_calls", &parallel)) return e;
  if (!out->sampling.json_schema.empty()) {
    return ApiError::BadRequest("'response_format' and 'tools' cannot be combined",
                                "response_format");
  }
  std::vector<structured::ToolSpec> specs;
  for (const auto& d : callable) specs.push_back({d.name, d.parameters_json});
  out->sampling.json_schema =
      structured::ToolCallSchema(specs, structured::ToolCallSyntaxOf(format).arguments_key);
  out->sampling.tool_mode = mode;
  out->sampling.tool_format = format;
  // Several calls in one answer unless the client says not, or names the one function to call.
  const bool named = choice != nullptr && choice->is_object();
  out->sampling.max_tool_calls = parallel && !named ? engine::SamplingParams::kMaxToolCalls : 1;
  out->tools = std::move(defs);
  return std::nullopt;
}

// Features we do not implement: refused unless absent, null or at their neutral value.
std::optional<ApiError> RejectUnsupported(const json& body, Endpoint endpoint) {
  if (const json* v = Field(body, "suffix")) {
    if (!v->is_string()) return WrongType("suffix", "a string", *v);
    if (!v->get<std::string>().empty()) return Unsupported("suffix", "suffix");
  }
  (void)endpoint;
  return std::nullopt;
}

// response_format: text (nothing), json_object (any object), json_schema (its "schema", compiled
// here so that an unsupported one is a 400 naming the problem).
std::optional<ApiError> ParseResponseFormat(const json& body, engine::SamplingParams* out) {
  const json* v = Field(body, "response_format");
  if (v == nullptr) return std::nullopt;
  const json* type = v->is_object() ? Field(*v, "type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return ApiError::BadRequest("'response_format' must be an object with a string 'type'",
                                "response_format");
  }
  const std::string t = type->get<std::string>();
  if (t == "text") return std::nullopt;
  if (t == "json_object") {
    out->json_schema = R"({"type":"object"})";
    return std::nullopt;
  }
  if (t != "json_schema") {
    return ApiError::BadRequest(
        "'response_format.type' must be text, json_object or json_schema, got '" + t + "'",
        "response_format.type");
  }
  const json* spec = Field(*v, "json_schema");
  if (spec == nullptr || !spec->is_object()) {
    return ApiError::BadRequest("'response_format.json_schema' must be an object with a 'schema'",
                                "response_format.json_schema");
  }
  const json* schema = Field(*spec, "schema");
  if (schema == nullptr || !(schema->is_object() || schema->is_boolean())) {
    return ApiError::BadRequest("'response_format.json_schema.schema' must be a JSON Schema object",
                                "response_format.json_schema.schema");
  }
  out->json_schema = schema->dump();
  if (auto compiled = structured::CompileSchema(out->json_schema); !compiled.ok()) {
    return ApiError::BadRequest(
        "'response_format.json_schema.schema': " + compiled.status().message(),
        "response_format.json_schema.schema");
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> CheckModel(const std::string& name, const ProtocolLimits& limits) {
  if (name == limits.served_model_name ||
      std::find(limits.aliases.begin(), limits.aliases.end(), name) != limits.aliases.end()) {
    return std::nullopt;
  }
  ApiError e;
  e.status = 404;
  e.message = "The model '" + name + "' does not exist; this server serves '" +
              limits.served_model_name + "'.";
  e.param = "model";
  e.code = "model_not_found";
  return e;
}

std::optional<ApiError> ParseRequest(Endpoint endpoint, std::string_view body_text,
                                     const ProtocolLimits& limits, ParsedRequest* out) {
  json body;
  try {
    body = json::parse(body_text.begin(), body_text.end());
  } catch (const json::exception& e) {
    // Covers malformed JSON and ill-formed UTF-8 inside strings.
    return ApiError::BadRequest(std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) return ApiError::BadRequest("the request body must be a JSON object");
  *out = ParsedRequest{};
  out->endpoint = endpoint;

  try {
    // Responses carry the name the client used (one of the served names), else the main one.
    out->model = limits.served_model_name;
    if (const json* m = Field(body, "model")) {
      if (!m->is_string()) return WrongType("model", "a string", *m);
      if (auto e = CheckModel(m->get<std::string>(), limits)) return e;
      out->model = m->get<std::string>();
    }

    if (endpoint == Endpoint::kChatCompletions) {
      if (auto e = ParseMessages(body, &out->messages)) return e;
    } else {
      if (auto e = ParsePrompt(body, limits.max_prompts, out)) return e;
    }
    if (auto e = RejectUnsupported(body, endpoint)) return e;
    if (auto e = ParseOutputControls(body, endpoint, limits, out)) return e;
    if (auto e = ParseResponseFormat(body, &out->sampling)) return e;
    if (auto e = ParseTools(body, body_text, endpoint, limits.tool_format, out)) return e;
    const int64_t choices = int64_t{out->n} * std::max<int64_t>(1, out->prompts.size());
    if (choices > kMaxChoicesPerRequest) {
      return ApiError::BadRequest("n times the number of prompts may be at most " +
                                      std::to_string(kMaxChoicesPerRequest) + ", got " +
                                      std::to_string(choices),
                                  "n");
    }

    std::optional<int64_t> max_tokens;
    std::optional<int64_t> max_completion_tokens;
    // 0 only to score a prompt (completions' echo with logprobs, as evaluation harnesses send).
    const int64_t fewest = out->echo && out->sampling.logprobs >= 0 ? 0 : 1;
    if (auto e = GetInt(body, "max_tokens", fewest, limits.max_model_len, &max_tokens)) return e;
    if (auto e = GetInt(body, "max_completion_tokens", 1, limits.max_model_len,
                        &max_completion_tokens)) {
      return e;
    }
    if (max_completion_tokens) {
      out->max_tokens = static_cast<int>(*max_completion_tokens);
    } else if (max_tokens) {
      out->max_tokens = static_cast<int>(*max_tokens);
    }

    std::optional<double> d;
    if (auto e = GetNumber(body, "temperature", 0.0, 2.0, &d)) return e;
    if (d) out->sampling.temperature = static_cast<float>(*d);
    d.reset();
    if (auto e = GetNumber(body, "top_p", 0.0, 1.0, &d)) return e;
    if (d) {
      if (*d <= 0.0)
        return ApiError::BadRequest("'top_p' must be greater than 0 and at most 1", "top_p");
      out->sampling.top_p = static_cast<float>(*d);
    }
    d.reset();
    if (auto e = GetNumber(body, "min_p", 0.0, 1.0, &d)) return e;
    if (d) out->sampling.min_p = static_cast<float>(*d);
    std::optional<int64_t> i;
    if (auto e = GetInt(body, "top_k", -1, 1 << 20, &i)) return e;
    if (i) out->sampling.top_k = *i < 0 ? 0 : static_cast<int>(*i);  // -1 (vLLM) and 0: off
    i.reset();
    if (const json* seed = Field(body, "seed")) {
      if (!seed->is_number_integer()) return WrongType("seed", "an integer", *seed);
      out->sampling.seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                                      : static_cast<uint64_t>(seed->get<int64_t>());
      out->seeded = true;
    } else {
      out->sampling.seed = RandomSeed();  // unseeded requests differ, as OpenAI's do
    }
    if (auto e = ParseStop(body, &out->stop)) return e;
    if (auto e = GetBool(body, "stream", &out->stream)) return e;
    if (auto e = GetBool(body, "ignore_eos", &out->ignore_eos)) return e;
    for (auto [field, target] :
         {std::pair{"slo_ttft_ms", &out->slo_ttft_ms}, std::pair{"slo_tbt_ms", &out->slo_tbt_ms}}) {
      std::optional<double> ms;
      if (auto e = GetNumber(body, field, 0.0, 3.6e6, &ms)) return e;
      if (ms) *target = *ms;
    }
    if (const json* so = Field(body, "stream_options")) {
      if (!out->stream) {
        return ApiError::BadRequest("'stream_options' is only allowed when 'stream' is true",
                                    "stream_options");
      }
      if (!so->is_object()) return WrongType("stream_options", "an object", *so);
      if (auto e = GetBool(*so, "include_usage", &out->include_usage)) {
        e->message = "'stream_options.include_usage' must be a boolean";
        e->param = "stream_options.include_usage";
        return e;
      }
    }
    if (const json* user = Field(body, "user")) {
      if (!user->is_string()) return WrongType("user", "a string", *user);
    }
    const Status st = out->sampling.Validate();
    if (!st.ok()) return ApiError::BadRequest(st.message());
  } catch (const json::exception& e) {
    // Defensive: the checks above test types before every get<>().
    return ApiError::BadRequest(std::string("invalid request: ") + e.what());
  }
  return std::nullopt;
}

std::optional<ApiError> BuildPrompt(const ParsedRequest& request, const model::Tokenizer& tokenizer,
                                    const model::ChatTemplate* chat_template,
                                    const std::string& no_template_reason, int max_model_len,
                                    std::vector<int32_t>* prompt_tokens, int* max_tokens,
                                    size_t prompt_index) {
  prompt_tokens->clear();
  if (request.endpoint == Endpoint::kChatCompletions) {
    if (chat_template == nullptr) {
      return ApiError::BadRequest("this model has no chat template that tandem supports (" +
                                      no_template_reason +
                                      "); use /v1/completions with a formatted prompt instead",
                                  "messages");
    }
    auto text = RenderChatPrompt(*chat_template, request.messages, request.tools,
                                 /*add_generation_prompt=*/true);
    if (!text.ok()) return ApiError::BadRequest(text.status().message(), "messages");
    *prompt_tokens = tokenizer.Encode(*text, tokenizer.add_bos(), /*parse_special=*/true);
  } else if (prompt_index >= request.prompts.size()) {
    return ApiError::BadRequest("'prompt' is required", "prompt");
  } else if (const CompletionPrompt& p = request.prompts[prompt_index]; !p.token_ids.empty()) {
    const int32_t vocab = tokenizer.vocab_size();
    for (int32_t id : p.token_ids) {
      if (id < 0 || id >= vocab) {
        return ApiError::BadRequest("'prompt' token id " + std::to_string(id) +
                                        " is outside the vocabulary (size " +
                                        std::to_string(vocab) + ")",
                                    "prompt");
      }
    }
    *prompt_tokens = p.token_ids;
  } else {
    *prompt_tokens = tokenizer.Encode(p.text, tokenizer.add_bos(), /*parse_special=*/false);
  }
  const char* what = request.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  if (prompt_tokens->empty()) {
    return ApiError::BadRequest(std::string("the ") + what + " is empty after tokenization", what);
  }
  const int n = static_cast<int>(prompt_tokens->size());
  if (n >= max_model_len) {
    return ApiError::BadRequest("This model's maximum context length is " +
                                    std::to_string(max_model_len) + " tokens, but the " + what +
                                    " has " + std::to_string(n) +
                                    " tokens (at least one token must be left for the completion).",
                                what);
  }
  if (request.max_tokens) {
    if (n + *request.max_tokens > max_model_len) {
      return ApiError::BadRequest(
          "This model's maximum context length is " + std::to_string(max_model_len) +
              " tokens. However, you requested " + std::to_string(n + *request.max_tokens) +
              " tokens (" + std::to_string(n) + " in the " + what + ", " +
              std::to_string(*request.max_tokens) +
              " for the completion). Please reduce the length of the " + what +
              " or the completion.",
          "max_tokens");
    }
    *max_tokens = *request.max_tokens;
  } else {
    *max_tokens = max_model_len - n;
  }
  return std::nullopt;
}

}  // namespace tandem::server
