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

json FinishValue(const std::string& finish_reason) {
  return finish_reason.empty() ? json(nullptr) : json(finish_reason);
}

// One streamed choice: chat delta or completion text.
std::string Chunk(const ResponseContext& ctx, json delta_or_text,
                  const std::string& finish_reason) {
  json j = Envelope(ctx, /*chunk=*/true);
  json choice = {{"index", 0}};
  if (IsChat(ctx)) {
    choice["delta"] = std::move(delta_or_text);
  } else {
    choice["text"] = std::move(delta_or_text);
  }
  choice["logprobs"] = nullptr;
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

std::string CompletionBody(const ResponseContext& ctx, const std::string& text,
                           const std::string& finish_reason, const Usage& usage) {
  json j = Envelope(ctx, /*chunk=*/false);
  json choice = {{"index", 0}};
  if (IsChat(ctx)) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = FinishValue(finish_reason);
  j["choices"] = json::array({std::move(choice)});
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ChatRoleChunk(const ResponseContext& ctx) {
  return Chunk(ctx, json{{"role", "assistant"}, {"content", ""}}, "");
}

std::string TextChunk(const ResponseContext& ctx, const std::string& text) {
  return IsChat(ctx) ? Chunk(ctx, json{{"content", text}}, "") : Chunk(ctx, json(text), "");
}

std::string FinishChunk(const ResponseContext& ctx, const std::string& finish_reason) {
  return IsChat(ctx) ? Chunk(ctx, json::object(), finish_reason)
                     : Chunk(ctx, json(""), finish_reason);
}

std::string UsageChunk(const ResponseContext& ctx, const Usage& usage) {
  json j = Envelope(ctx, /*chunk=*/true);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string SseEvent(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

std::string ModelsBody(const std::string& model, int64_t created) {
  json m = {{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "tandem"}};
  return Dump(json{{"object", "list"}, {"data", json::array({std::move(m)})}});
}

}  // namespace tandem::server
