// vLLM's /tokenize and /detokenize endpoints, in vLLM's request and response shapes.
//
//   POST /tokenize    {"prompt": str, "add_special_tokens": bool (default true)}
//                  or {"messages": [...], "add_generation_prompt": bool (default true)}
//                     (+ "model", "return_token_strs": bool)
//                 ->  {"count", "max_model_len", "tokens": [ids], "token_strs": [..] or null}
//   POST /detokenize  {"tokens": [ids]} (+ "model")  ->  {"prompt": str}
//
// Prompts are tokenized exactly as the generation endpoints do (BuildPrompt's rules: completions
// text without special-token parsing, chat through the template with it).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "server/api_error.h"
#include "server/openai_request.h"

namespace tandem::server {

// Fills *response (JSON) or returns the error (400 bad input, 404 unknown model).
std::optional<ApiError> Tokenize(std::string_view body, const ProtocolLimits& limits,
                                 const model::Tokenizer& tokenizer,
                                 const model::ChatTemplate* chat_template,
                                 const std::string& no_template_reason, std::string* response);

std::optional<ApiError> Detokenize(std::string_view body, const ProtocolLimits& limits,
                                   const model::Tokenizer& tokenizer, std::string* response);

}  // namespace tandem::server
