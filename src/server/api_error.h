// An OpenAI-shaped API error: the HTTP status and the fields of
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
#pragma once

#include <string>

namespace tandem::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null

  static ApiError BadRequest(std::string message, std::string param = "") {
    return {400, std::move(message), "invalid_request_error", std::move(param), ""};
  }
};

// The JSON body for `error` (one line, no trailing newline). Invalid UTF-8 is replaced.
std::string ApiErrorJson(const ApiError& error);

}  // namespace tandem::server
