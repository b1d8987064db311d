#include "server/tokenize.h"

#include <nlohmann/json.hpp>

#include "server/openai_tools.h"

namespace tandem::server {
namespace {

using nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The boolean `key` of `body` (absent or null: `fallback`).
std::optional<ApiError> Flag(const json& body, const char* key, bool fallback, bool* out) {
  *out = fallback;
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) {
    return ApiError::BadRequest("'" + std::string(key) + "' must be a boolean", key);
  }
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ParseObject(std::string_view text, json* out) {
  *out = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return ApiError::BadRequest("the request body is not valid JSON");
  if (!out->is_object()) return ApiError::BadRequest("the request body must be a JSON object");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> Tokenize(std::string_view body_text, const ProtocolLimits& limits,
                                 const model::Tokenizer& tokenizer,
                                 const model::ChatTemplate* chat_template,
                                 const std::string& no_template_reason, std::string* response) {
  json body;
  if (auto e = ParseObject(body_text, &body)) return e;
  const bool chat = body.contains("messages");
  // The generation endpoints' parser checks the model, the messages or the prompt.
  ParsedRequest parsed;
  if (auto e = ParseRequest(chat ? Endpoint::kChatCompletions : Endpoint::kCompletions, body_text,
                            limits, &parsed)) {
    return e;
  }
  bool return_strs = false;
  if (auto e = Flag(body, "return_token_strs", false, &return_strs)) return e;
  std::vector<int32_t> tokens;
  if (chat) {
    bool add_generation_prompt = true;
    if (auto e = Flag(body, "add_generation_prompt", true, &add_generation_prompt)) return e;
    if (chat_template == nullptr) {
      return ApiError::BadRequest(
          "this model has no chat template that tandem supports (" + no_template_reason + ")",
          "messages");
    }
    auto text =
        RenderChatPrompt(*chat_template, parsed.messages, parsed.tools, add_generation_prompt);
    if (!text.ok()) return ApiError::BadRequest(text.status().message(), "messages");
    tokens = tokenizer.Encode(*text, tokenizer.add_bos(), /*parse_special=*/true);
  } else {
    if (parsed.prompts.size() != 1) {
      return ApiError::BadRequest("'prompt' must be one prompt here", "prompt");
    }
    bool add_special = true;
    if (auto e = Flag(body, "add_special_tokens", true, &add_special)) return e;
    const CompletionPrompt& p = parsed.prompts[0];
    if (!p.token_ids.empty()) {
      tokens = p.token_ids;
    } else {
      tokens = tokenizer.Encode(p.text, add_special && tokenizer.add_bos(),
                                /*parse_special=*/false);
    }
  }
  json out = {{"count", tokens.size()},
              {"max_model_len", limits.max_model_len},
              {"tokens", tokens},
              {"token_strs", nullptr}};
  if (return_strs) {
    json strs = json::array();
    for (int32_t id : tokens) strs.push_back(tokenizer.TokenToPiece(id));
    out["token_strs"] = std::move(strs);
  }
  *response = Dump(out);
  return std::nullopt;
}

std::optional<ApiError> Detokenize(std::string_view body_text, const ProtocolLimits& limits,
                                   const model::Tokenizer& tokenizer, std::string* response) {
  json body;
  if (auto e = ParseObject(body_text, &body)) return e;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return ApiError::BadRequest("'model' must be a string", "model");
    if (auto e = CheckModel(it->get<std::string>(), limits)) return e;
  }
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) {
    return ApiError::BadRequest("'tokens' must be an array of token ids", "tokens");
  }
  std::vector<int32_t> ids;
  for (const json& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        t.get<int64_t>() >= tokenizer.vocab_size()) {
      return ApiError::BadRequest(
          "'tokens' must hold token ids in [0, " + std::to_string(tokenizer.vocab_size()) + ")",
          "tokens");
    }
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  *response = Dump(json{{"prompt", tokenizer.Decode(ids)}});
  return std::nullopt;
}

}  // namespace tandem::server
