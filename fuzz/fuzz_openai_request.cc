// The OpenAI front door's request handling, from body bytes to prompt tokens: ParseRequest,
// then what the server does next with a parsed request (BuildPrompt per prompt, token-id
// checks, the structured-output constraint), and /tokenize and /detokenize bodies.
// Input: byte 0 picks the endpoint (mod 4: chat, completions, tokenize, detokenize); the rest
// is the body. Property: no crash, no sanitizer report; every error is a 4xx.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "server/openai_request.h"
#include "server/tokenize.h"
#include "structured/token_constraint.h"

namespace {

using namespace tandem;

struct Fixture {
  model::TextFrontEnd front = fuzz::LoadFrontEnd("SmolLM2-135M-Instruct.Q4_1.gguf");
  server::ProtocolLimits limits;
  std::shared_ptr<const structured::TokenTable> table;

  Fixture() {
    limits.served_model_name = "smollm2";
    limits.aliases = {"other"};
    limits.max_model_len = 2048;
    table = structured::TokenTable::FromTokenizer(*front.tokenizer);
  }
  const model::ChatTemplate* chat_template() const {
    return front.chat_template ? &*front.chat_template : nullptr;
  }
};

const Fixture& GetFixture() {
  static const Fixture* f = new Fixture();
  return *f;
}

void CheckError(const std::optional<server::ApiError>& e) {
  if (e) TANDEM_FUZZ_CHECK(e->status >= 400 && e->status < 500 && !e->message.empty());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  GetFixture();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const Fixture& fx = GetFixture();
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const int mode = data[0] % 4;
  if (mode >= 2) {
    std::string response;
    const std::optional<server::ApiError> e =
        mode == 2 ? server::Tokenize(body, fx.limits, *fx.front.tokenizer, fx.chat_template(),
                                     fx.front.chat_template_error, &response)
                  : server::Detokenize(body, fx.limits, *fx.front.tokenizer, &response);
    CheckError(e);
    if (!e) TANDEM_FUZZ_CHECK(!response.empty());
    return 0;
  }
  const server::Endpoint endpoint =
      mode == 0 ? server::Endpoint::kChatCompletions : server::Endpoint::kCompletions;
  server::ParsedRequest parsed;
  std::optional<server::ApiError> e = server::ParseRequest(endpoint, body, fx.limits, &parsed);
  CheckError(e);
  if (e) return 0;
  TANDEM_FUZZ_CHECK(parsed.n >= 1 && parsed.n <= fx.limits.max_n);
  const size_t n_prompts =
      endpoint == server::Endpoint::kChatCompletions ? 1 : parsed.prompts.size();
  TANDEM_FUZZ_CHECK(n_prompts >= 1);
  for (size_t p = 0; p < n_prompts; ++p) {
    std::vector<int32_t> tokens;
    int max_tokens = 0;
    e = server::BuildPrompt(parsed, *fx.front.tokenizer, fx.chat_template(),
                            fx.front.chat_template_error, fx.limits.max_model_len, &tokens,
                            &max_tokens, p);
    CheckError(e);
    if (e) return 0;
    TANDEM_FUZZ_CHECK(!tokens.empty());
    TANDEM_FUZZ_CHECK(static_cast<int>(tokens.size()) + max_tokens <= fx.limits.max_model_len);
    for (int32_t t : tokens) TANDEM_FUZZ_CHECK(t >= 0 && t < fx.front.tokenizer->vocab_size());
  }
  if (!parsed.sampling.ValidateTokens(fx.front.tokenizer->vocab_size()).ok()) return 0;
  // A schema that parsed must compile into a constraint (the server would answer 500 else).
  auto constraint = structured::MakeConstraint(parsed.sampling, [&] { return fx.table; });
  TANDEM_FUZZ_CHECK(constraint.ok());
  return 0;
}
