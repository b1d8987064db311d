#include "server/openai_request.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>

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
    if (r != "system" && r != "user" && r != "assistant") {
      return ApiError::BadRequest("'" + where +
                                      ".role' must be one of system, developer, user, "
                                      "assistant; got '" +
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
    if (Field(m, "tool_calls") != nullptr)
      return Unsupported(where + ".tool_calls", "tool calling");
    out->push_back({std::move(r), std::move(text)});
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

std::optional<ApiError> ParsePrompt(const json& body, ParsedRequest* out) {
  const json* v = Field(body, "prompt");
  if (v == nullptr) return ApiError::BadRequest("'prompt' is required", "prompt");
  const char* kExpected = "a string, an array of token ids, or an array with one of those";
  if (v->is_string()) {
    out->prompt = v->get<std::string>();
    return std::nullopt;
  }
  if (!v->is_array()) return WrongType("prompt", kExpected, *v);
  if (v->empty()) return ApiError::BadRequest("'prompt' must not be empty", "prompt");
  const json& first = (*v)[0];
  if (first.is_string() || first.is_array()) {
    if (v->size() > 1) return Unsupported("prompt", "more than one prompt per request");
    if (first.is_string()) {
      out->prompt = first.get<std::string>();
      return std::nullopt;
    }
    if (first.empty()) return ApiError::BadRequest("'prompt' must not be empty", "prompt");
    return ParseTokenIds(first, &out->prompt_token_ids);
  }
  if (first.is_number()) return ParseTokenIds(*v, &out->prompt_token_ids);
  return WrongType("prompt", kExpected, *v);
}

// Features we do not implement: refused unless absent, null or at their neutral value.
std::optional<ApiError> RejectUnsupported(const json& body, Endpoint endpoint) {
  std::optional<int64_t> n;
  if (auto e = GetInt(body, "n", 1, std::numeric_limits<int>::max(), &n)) return e;
  if (n && *n != 1) return Unsupported("n", "n > 1 (one choice per request)");
  if (auto e = GetInt(body, "best_of", 1, std::numeric_limits<int>::max(), &n)) return e;
  if (n && *n != 1) return Unsupported("best_of", "best_of > 1");
  for (const char* key : {"presence_penalty", "frequency_penalty"}) {
    std::optional<double> d;
    if (auto e = GetNumber(body, key, -2.0, 2.0, &d)) return e;
    if (d && *d != 0.0) return Unsupported(key, "a non-zero penalty");
  }
  std::optional<double> rep;
  if (auto e = GetNumber(body, "repetition_penalty", 0.0, 10.0, &rep)) return e;
  if (rep && *rep != 1.0)
    return Unsupported("repetition_penalty", "a repetition penalty other than 1");
  if (const json* v = Field(body, "logprobs")) {
    if (!(v->is_boolean() && !v->get<bool>())) return Unsupported("logprobs", "logprobs");
  }
  if (const json* v = Field(body, "top_logprobs")) {
    if (!(v->is_number_integer() && v->get<int64_t>() == 0))
      return Unsupported("top_logprobs", "top_logprobs");
  }
  bool echo = false;
  if (auto e = GetBool(body, "echo", &echo)) return e;
  if (echo) return Unsupported("echo", "echo");
  if (const json* v = Field(body, "logit_bias")) {
    if (!v->is_object()) return WrongType("logit_bias", "an object", *v);
    if (!v->empty()) return Unsupported("logit_bias", "logit_bias");
  }
  for (const char* key : {"tools", "functions"}) {
    if (const json* v = Field(body, key)) {
      if (!v->is_array()) return WrongType(key, "an array", *v);
      if (!v->empty()) return Unsupported(key, "tool calling");
    }
  }
  if (const json* v = Field(body, "suffix")) {
    if (!v->is_string()) return WrongType("suffix", "a string", *v);
    if (!v->get<std::string>().empty()) return Unsupported("suffix", "suffix");
  }
  if (const json* v = Field(body, "response_format")) {
    const json* type = v->is_object() ? Field(*v, "type") : nullptr;
    if (type == nullptr || !type->is_string()) {
      return ApiError::BadRequest("'response_format' must be an object with a string 'type'",
                                  "response_format");
    }
    if (type->get<std::string>() != "text") {
      return Unsupported("response_format", "response_format '" + type->get<std::string>() + "'");
    }
  }
  (void)endpoint;
  return std::nullopt;
}

}  // namespace

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
    if (const json* m = Field(body, "model")) {
      if (!m->is_string()) return WrongType("model", "a string", *m);
      if (m->get<std::string>() != limits.served_model_name) {
        ApiError e;
        e.status = 404;
        e.message = "The model '" + m->get<std::string>() +
                    "' does not exist; this server serves '" + limits.served_model_name + "'.";
        e.param = "model";
        e.code = "model_not_found";
        return e;
      }
    }
    out->model = limits.served_model_name;

    if (endpoint == Endpoint::kChatCompletions) {
      if (auto e = ParseMessages(body, &out->messages)) return e;
    } else {
      if (auto e = ParsePrompt(body, out)) return e;
    }
    if (auto e = RejectUnsupported(body, endpoint)) return e;

    std::optional<int64_t> max_tokens;
    std::optional<int64_t> max_completion_tokens;
    if (auto e = GetInt(body, "max_tokens", 1, limits.max_model_len, &max_tokens)) return e;
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
                                    std::vector<int32_t>* prompt_tokens, int* max_tokens) {
  prompt_tokens->clear();
  if (request.endpoint == Endpoint::kChatCompletions) {
    if (chat_template == nullptr) {
      return ApiError::BadRequest("this model has no chat template that tandem supports (" +
                                      no_template_reason +
                                      "); use /v1/completions with a formatted prompt instead",
                                  "messages");
    }
    const std::string text = chat_template->Apply(request.messages, /*add_generation_prompt=*/true);
    *prompt_tokens = tokenizer.Encode(text, tokenizer.add_bos(), /*parse_special=*/true);
  } else if (!request.prompt_token_ids.empty()) {
    const int32_t vocab = tokenizer.vocab_size();
    for (int32_t id : request.prompt_token_ids) {
      if (id < 0 || id >= vocab) {
        return ApiError::BadRequest("'prompt' token id " + std::to_string(id) +
                                        " is outside the vocabulary (size " +
                                        std::to_string(vocab) + ")",
                                    "prompt");
      }
    }
    *prompt_tokens = request.prompt_token_ids;
  } else {
    *prompt_tokens = tokenizer.Encode(request.prompt, tokenizer.add_bos(), /*parse_special=*/false);
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
