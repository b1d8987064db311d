#include "server/openai_response.h"

#include <nlohmann/json.hpp>
#include <random>

#include "common/mutex.h"

namespace tandem::server {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

bool IsChat(const ResponseContext& ctx) { return ctx.endpoint == Endpoint::kChatCompletions; }

json Envelope(const ResponseContext& ctx, bool chunk) {
  json j;
  j["id"] = ctx.id;
  j["object"] =
      IsChat(ctx) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = ctx.created;
  j["model"] = ctx.model;
  j["system_fingerprint"] = "tandem";
  return j;
}

json ToolCallJson(const ToolCallOut& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

json FinishValue(const std::string& finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

// The text a token shows as: its piece when valid UTF-8, else OpenAI's "bytes:\xNN..." form.
std::string TokenText(const std::string& piece) {
  bool valid = true;
  try {
    (void)json(piece).dump();  // strict: throws on ill-formed UTF-8
  } catch (const json::exception&) {
    valid = false;
  }
  if (valid) return piece;
  std::string out = "bytes:";
  char buf[8];
  for (unsigned char c : piece) {
    std::snprintf(buf, sizeof(buf), "\\x%02x", c);
    out += buf;
  }
  return out;
}

json Bytes(const std::string& piece) {
  json a = json::array();
  for (unsigned char c : piece) a.push_back(static_cast<int>(c));
  return a;
}

json LogprobValue(const std::optional<float>& lp) { return lp ? json(*lp) : json(nullptr); }

// Chat: {"content": [...], "refusal": null}.
json ChatLogprobs(std::span<const TokenLogprobs> tokens) {
  json content = json::array();
  for (const TokenLogprobs& t : tokens) {
    json top = json::array();
    for (const auto& [piece, lp] : t.top) {
      top.push_back({{"token", TokenText(piece)}, {"logprob", lp}, {"bytes", Bytes(piece)}});
    }
    content.push_back({{"token", TokenText(t.piece)},
                       {"logprob", LogprobValue(t.logprob)},
                       {"bytes", Bytes(t.piece)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

// Completions: parallel arrays; offsets count bytes from `text_offset`.
json CompletionLogprobs(std::span<const TokenLogprobs> tokens, int64_t text_offset) {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprobs& t : tokens) {
    out["tokens"].push_back(TokenText(t.piece));
    out["token_logprobs"].push_back(LogprobValue(t.logprob));
    if (t.logprob) {
      json top = json::object();
      top[TokenText(t.piece)] = *t.logprob;
      for (const auto& [piece, lp] : t.top) top[TokenText(piece)] = lp;
      out["top_logprobs"].push_back(std::move(top));
    } else {
      out["top_logprobs"].push_back(nullptr);
    }
    out["text_offset"].push_back(text_offset);
    text_offset += static_cast<int64_t>(t.piece.size());
  }
  return out;
}

json LogprobsJson(const ResponseContext& ctx, std::span<const TokenLogprobs> tokens,
                  int64_t text_offset) {
  if (!ctx.logprobs) return nullptr;
  return IsChat(ctx) ? ChatLogprobs(tokens) : CompletionLogprobs(tokens, text_offset);
}

// One streamed choice: chat delta or completion text.
std::string Chunk(const ResponseContext& ctx, int index, json delta_or_text,
                  const std::string& finish_reason, json logprobs = nullptr) {
  json j = Envelope(ctx, /*chunk=*/true);
  json choice = {{"index", index}};
  if (IsChat(ctx)) {
    choice["delta"] = std::move(delta_or_text);
  } else {
    choice["text"] = std::move(delta_or_text);
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = FinishValue(finish_reason);
  j["choices"] = json::array({std::move(choice)});
  if (ctx.include_usage) j["usage"] = nullptr;
  return Dump(j);
}

}  // namespace

std::string ApiErrorJson(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return Dump(json{{"error", std::move(err)}});
}

std::string NewRequestId(Endpoint endpoint) {
  // A struct so that the generator can be annotated (a local static cannot be GUARDED_BY); still
  // constructed on the first call.
  struct IdSource {
    Mutex mu;
    std::mt19937_64 rng TANDEM_GUARDED_BY(mu){std::random_device{}()};
  };
  static IdSource ids;
  uint64_t a, b;
  {
    MutexLock lock(&ids.mu);
    a = ids.rng();
    b = ids.rng();
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b & 0xffffffffu));
  return (endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-") + std::string(buf);
}

std::string CompletionBody(const ResponseContext& ctx, std::span<const Choice> choices,
                           const Usage& usage) {
  json j = Envelope(ctx, /*chunk=*/false);
  j["choices"] = json::array();
  for (const Choice& c : choices) {
    json choice = {{"index", c.index}};
    if (IsChat(ctx) && !c.tool_calls.empty()) {
      json calls = json::array();
      for (const ToolCallOut& call : c.tool_calls) calls.push_back(ToolCallJson(call));
      choice["message"] = {
          {"role", "assistant"}, {"content", nullptr}, {"tool_calls", std::move(calls)}};
    } else if (IsChat(ctx)) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = LogprobsJson(ctx, c.logprobs, 0);
    choice["finish_reason"] = FinishValue(c.finish_reason);
    j["choices"].push_back(std::move(choice));
  }
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string CompletionBody(const ResponseContext& ctx, const std::string& text,
                           const std::string& finish_reason, const Usage& usage) {
  const Choice one{0, text, finish_reason, {}};
  return CompletionBody(ctx, std::span(&one, 1), usage);
}

std::string ChatRoleChunk(const ResponseContext& ctx, int index) {
  return Chunk(ctx, index, json{{"role", "assistant"}, {"content", ""}}, "");
}

std::string TextChunk(const ResponseContext& ctx, const std::string& text, int index,
                      std::span<const TokenLogprobs> logprobs, int64_t text_offset) {
  json body = IsChat(ctx) ? json{{"content", text}} : json(text);
  return Chunk(ctx, index, std::move(body), "", LogprobsJson(ctx, logprobs, text_offset));
}

std::string ToolCallChunk(const ResponseContext& ctx, const ToolCallOut& call, int index,
                          int call_index) {
  json entry = ToolCallJson(call);
  entry["index"] = call_index;
  return Chunk(ctx, index, json{{"tool_calls", json::array({std::move(entry)})}}, "");
}

std::string FinishChunk(const ResponseContext& ctx, const std::string& finish_reason, int index) {
  return IsChat(ctx) ? Chunk(ctx, index, json::object(), finish_reason)
                     : Chunk(ctx, index, json(""), finish_reason);
}

std::string UsageChunk(const ResponseContext& ctx, const Usage& usage) {
  json j = Envelope(ctx, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string SseEvent(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

std::string ModelsBody(const std::vector<std::string>& names, int64_t created) {
  json data = json::array();
  for (const std::string& name : names) {
    data.push_back(
        {{"id", name}, {"object", "model"}, {"created", created}, {"owned_by", "tandem"}});
  }
  return Dump(json{{"object", "list"}, {"data", std::move(data)}});
}

}  // namespace tandem::server
