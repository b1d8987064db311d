// Structured output for the sampler: a JSON schema (json_schema.h) enforced token by token
// through a JsonMatcher over each token's bytes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/sampling_params.h"
#include "engine/token_constraint.h"
#include "model/tokenizer.h"
#include "structured/json_schema.h"

namespace tandem::structured {

// Every token's bytes and kind, built once per model and shared (immutable) by the sequences.
struct TokenTable {
  std::vector<std::string> pieces;  // id -> raw bytes
  std::vector<uint8_t> end;         // id -> end-of-generation
  std::vector<uint8_t> control;     // id -> control token (never part of structured output)
  // Compact, for the scans over the vocabulary: the first byte of an ordinary token's piece, or
  // kEndToken / kNeverToken; and whether its piece is that one byte.
  static constexpr int16_t kEndToken = -1;
  static constexpr int16_t kNeverToken = -2;  // control tokens, empty pieces
  std::vector<int16_t> first_byte;
  std::vector<uint8_t> single_byte;
  // The piece's length when every byte is printable ASCII other than '"' and '\\' (text that
  // may go inside a JSON string as it is), else 0; capped at 65,535.
  std::vector<uint16_t> plain_length;
  // An ordinary token's second byte (-1 for one-byte pieces and the others), and how many
  // ordinary tokens of two bytes or more begin with each byte.
  std::vector<int16_t> second_byte;
  std::array<int32_t, 256> multi_byte_tokens_by_first{};
  // Ordinary tokens grouped by first byte: those beginning with byte b are
  // by_first_ids[by_first_offsets[b] .. by_first_offsets[b + 1]); and the end tokens.
  std::array<int32_t, 257> by_first_offsets{};
  std::vector<int32_t> by_first_ids;
  std::vector<int32_t> end_ids;

  static std::shared_ptr<const TokenTable> FromTokenizer(const model::Tokenizer& tokenizer);
};

// A constraint that lets through the tokens whose bytes keep the output a valid prefix of a
// document of `schema`, and the end-of-generation tokens once the document is complete.
std::unique_ptr<engine::TokenConstraint> MakeJsonConstraint(
    std::shared_ptr<const Schema> schema, std::shared_ptr<const TokenTable> table);

// Tool mode (structured/tool_call.h): the answer is 1 to max_calls calls of `call_schema`
// written in `format`, or (unless `required`) a message.
std::unique_ptr<engine::TokenConstraint> MakeToolCallConstraint(
    std::shared_ptr<const Schema> call_schema, bool required,
    std::shared_ptr<const TokenTable> table, int max_calls = 1,
    engine::SamplingParams::ToolFormat format = engine::SamplingParams::ToolFormat::kHermes);

// The constraint a request's sampling settings ask for: none (nullptr) without a json_schema,
// else the schema's (json_schema) or, in tool mode, the tool call's. InvalidArgument when the
// schema does not compile. `table` is called only when a constraint is made.
StatusOr<std::unique_ptr<engine::TokenConstraint>> MakeConstraint(
    const engine::SamplingParams& sampling,
    const std::function<std::shared_ptr<const TokenTable>()>& table);

}  // namespace tandem::structured
