#include "structured/token_constraint.h"

#include <algorithm>
#include <bitset>

#include "structured/json_matcher.h"
#include "structured/tool_call.h"

namespace tandem::structured {
namespace {

// Whether the matcher is in a state where any bytes may follow (a tool-mode message).
template <typename M>
bool AnythingGoes(const M& m) {
  if constexpr (requires { m.Free(); }) {
    return m.Free();
  } else {
    return false;
  }
}

// A constraint over a byte matcher M (JsonMatcher, ToolCallMatcher): Feed, FeedAll, Complete,
// Closed, WouldAccept(bytes, scratch).
template <typename M>
class ByteConstraint final : public engine::TokenConstraint {
 public:
  ByteConstraint(std::shared_ptr<const TokenTable> table, M matcher)
      : table_(std::move(table)), matcher_(matcher), scratch_(std::move(matcher)) {}

  bool Allows(int32_t token) const override {
    if (token < 0 || static_cast<size_t>(token) >= table_->first_byte.size()) return false;
    const int16_t first = table_->first_byte[token];
    if (first == TokenTable::kEndToken) return broken_ || matcher_.Complete();
    if (first == TokenTable::kNeverToken || broken_ || matcher_.Closed()) return false;
    if (AnythingGoes(matcher_)) return true;
    EnsureFirstBytes();
    if (!first_bytes_[first]) return false;
    if (table_->single_byte[token]) return true;
    return matcher_.WouldAccept(table_->pieces[token], &scratch_);
  }

  void Restrict(std::span<float> weights) const override {
    const size_t n = std::min(weights.size(), table_->first_byte.size());
    for (size_t t = n; t < weights.size(); ++t) weights[t] = 0;
    if (broken_ || matcher_.Closed()) {
      for (size_t t = 0; t < n; ++t) {
        if (table_->first_byte[t] != TokenTable::kEndToken) weights[t] = 0;
      }
      return;
    }
    const bool end_ok = matcher_.Complete();
    const int16_t* first = table_->first_byte.data();
    if (AnythingGoes(matcher_)) {
      for (size_t t = 0; t < n; ++t) {
        if (first[t] == TokenTable::kNeverToken || (first[t] == TokenTable::kEndToken && !end_ok)) {
          weights[t] = 0;
        }
      }
      return;
    }
    EnsureFirstBytes();
    for (size_t t = 0; t < n; ++t) {
      if (weights[t] == 0) continue;
      const int16_t f = first[t];
      if (f == TokenTable::kEndToken) {
        if (!end_ok) weights[t] = 0;
      } else if (f == TokenTable::kNeverToken || !first_bytes_[f]) {
        weights[t] = 0;
      } else if (!table_->single_byte[t] && !matcher_.WouldAccept(table_->pieces[t], &scratch_)) {
        weights[t] = 0;
      }
    }
  }

  void Accept(int32_t token) override {
    if (token < 0 || static_cast<size_t>(token) >= table_->pieces.size()) return;
    if (table_->end[token]) return;
    first_bytes_ready_ = false;
    // A token that does not fit (resumed from elsewhere) leaves only the end open.
    if (broken_ || !matcher_.FeedAll(table_->pieces[token])) broken_ = true;
  }

  bool Finished() const override { return matcher_.Closed(); }

 private:
  // Most states allow few first bytes: a table of them (256 trials, once per position) turns
  // most refusals into a lookup.
  void EnsureFirstBytes() const {
    if (first_bytes_ready_) return;
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      first_bytes_[b] = matcher_.WouldAccept(std::string_view(&c, 1), &scratch_);
    }
    first_bytes_ready_ = true;
  }

  std::shared_ptr<const TokenTable> table_;
  M matcher_;
  mutable M scratch_;  // trials of candidate tokens
  bool broken_ = false;
  // Which bytes may come next (a cache of Allows, rebuilt after each accepted token).
  mutable std::bitset<256> first_bytes_;
  mutable bool first_bytes_ready_ = false;
};

}  // namespace

std::shared_ptr<const TokenTable> TokenTable::FromTokenizer(const model::Tokenizer& tokenizer) {
  auto t = std::make_shared<TokenTable>();
  const int32_t n = tokenizer.vocab_size();
  t->pieces.resize(n);
  t->end.resize(n);
  t->control.resize(n);
  t->first_byte.resize(n);
  t->single_byte.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const std::string& piece = t->pieces[id] = tokenizer.TokenToPiece(id);
    t->end[id] = tokenizer.IsEndOfGeneration(id) ? 1 : 0;
    t->control[id] = tokenizer.IsControl(id) ? 1 : 0;
    if (t->end[id]) {
      t->first_byte[id] = kEndToken;
    } else if (t->control[id] || piece.empty()) {
      t->first_byte[id] = kNeverToken;
    } else {
      t->first_byte[id] = static_cast<unsigned char>(piece[0]);
    }
    t->single_byte[id] = piece.size() == 1 ? 1 : 0;
  }
  return t;
}

std::unique_ptr<engine::TokenConstraint> MakeJsonConstraint(
    std::shared_ptr<const Schema> schema, std::shared_ptr<const TokenTable> table) {
  return std::make_unique<ByteConstraint<JsonMatcher>>(std::move(table),
                                                       JsonMatcher(std::move(schema)));
}

std::unique_ptr<engine::TokenConstraint> MakeToolCallConstraint(
    std::shared_ptr<const Schema> call_schema, bool required,
    std::shared_ptr<const TokenTable> table, int max_calls) {
  return std::make_unique<ByteConstraint<ToolCallMatcher>>(
      std::move(table), ToolCallMatcher(std::move(call_schema), required, max_calls));
}

StatusOr<std::unique_ptr<engine::TokenConstraint>> MakeConstraint(
    const engine::SamplingParams& sampling,
    const std::function<std::shared_ptr<const TokenTable>()>& table) {
  if (sampling.json_schema.empty()) return std::unique_ptr<engine::TokenConstraint>();
  TANDEM_ASSIGN_OR_RETURN(std::shared_ptr<const Schema> schema,
                          CompileSchema(sampling.json_schema));
  using ToolMode = engine::SamplingParams::ToolMode;
  if (sampling.tool_mode == ToolMode::kNone) return MakeJsonConstraint(std::move(schema), table());
  return MakeToolCallConstraint(std::move(schema), sampling.tool_mode == ToolMode::kRequired,
                                table(), sampling.max_tool_calls);
}

}  // namespace tandem::structured
