#include "structured/token_constraint.h"

#include <algorithm>
#include <array>
#include <bitset>

#include "structured/json_matcher.h"
#include "structured/tool_call.h"

namespace tandem::structured {
namespace {

// JsonMatcher::PlainStringRoom of the matcher.
template <typename M>
size_t PlainRoom(const M& m) {
  return m.PlainStringRoom();
}

// Whether the matcher is in a state where any bytes may follow (a tool-mode message).
template <typename M>
bool AnythingGoes(const M& m) {
  if constexpr (requires { m.Free(); }) {
    return m.Free();
  } else {
    return false;
  }
}

// Whether only the end may follow: a JSON value that is closed; a tool-mode answer whose calls
// are all made (ToolCallMatcher::Ended; after a call another may follow).
template <typename M>
bool OnlyTheEnd(const M& m) {
  if constexpr (requires { m.Ended(); }) {
    return m.Ended();
  } else {
    return m.Closed();
  }
}

// A constraint over a byte matcher M (JsonMatcher, ToolCallMatcher): Feed, FeedAll, Complete,
// Closed (or Ended), WouldAccept(bytes, scratch).
template <typename M>
class ByteConstraint final : public engine::TokenConstraint {
 public:
  ByteConstraint(std::shared_ptr<const TokenTable> table, M matcher)
      : table_(std::move(table)), matcher_(matcher), scratch_(std::move(matcher)) {}

  bool Allows(int32_t token) const override {
    if (token < 0 || static_cast<size_t>(token) >= table_->first_byte.size()) return false;
    const int16_t first = table_->first_byte[token];
    if (first == TokenTable::kEndToken) return broken_ || matcher_.Complete();
    if (first == TokenTable::kNeverToken || broken_ || OnlyTheEnd(matcher_)) return false;
    if (AnythingGoes(matcher_)) return true;
    EnsureFirstBytes();
    if (!first_bytes_[first]) return false;
    if (table_->single_byte[token]) return true;
    const uint16_t plain = table_->plain_length[token];
    if (plain != 0 && plain <= PlainRoom(matcher_)) return true;
    return matcher_.WouldAccept(table_->pieces[token], &scratch_);
  }

  void Restrict(std::span<float> weights) const override {
    const size_t n = std::min(weights.size(), table_->first_byte.size());
    for (size_t t = n; t < weights.size(); ++t) weights[t] = 0;
    if (broken_ || OnlyTheEnd(matcher_)) {
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
    // Inside a string: text tokens that fit pass without a trial (most of the vocabulary).
    const size_t room = PlainRoom(matcher_);
    if (room == 0 && first_bytes_.count() <= kFewFirstBytes) {
      RestrictByFirstByte(weights, end_ok);
      return;
    }
    const uint16_t* plain = table_->plain_length.data();
    const int16_t* second = table_->second_byte.data();
    for (size_t t = 0; t < n; ++t) {
      if (weights[t] == 0) continue;
      const int16_t f = first[t];
      if (f == TokenTable::kEndToken) {
        if (!end_ok) weights[t] = 0;
      } else if (f == TokenTable::kNeverToken || !first_bytes_[f]) {
        weights[t] = 0;
      } else if (table_->single_byte[t] || (plain[t] != 0 && plain[t] <= room)) {
        continue;
      } else if (second[t] >= 0 && !SecondBytes(f)[second[t]]) {
        weights[t] = 0;
      } else if (!matcher_.WouldAccept(table_->pieces[t], &scratch_)) {
        weights[t] = 0;
      }
    }
  }

  void Accept(int32_t token) override {
    if (token < 0 || static_cast<size_t>(token) >= table_->pieces.size()) return;
    if (table_->end[token]) return;
    first_bytes_ready_ = false;
    second_bytes_ready_.reset();
    // A token that does not fit (resumed from elsewhere) leaves only the end open.
    if (broken_ || !matcher_.FeedAll(table_->pieces[token])) broken_ = true;
  }

  bool Finished() const override { return OnlyTheEnd(matcher_); }

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

  // Restrict where few bytes may come next (between JSON values): only the tokens beginning
  // with one of them are looked at; every other weight is zeroed in one sweep.
  void RestrictByFirstByte(std::span<float> weights, bool end_ok) const {
    kept_.clear();
    for (size_t b = 0; b < 256; ++b) {
      if (!first_bytes_[b]) continue;
      const auto f = static_cast<int16_t>(b);
      for (int32_t i = table_->by_first_offsets[b]; i < table_->by_first_offsets[b + 1]; ++i) {
        const auto t = static_cast<size_t>(table_->by_first_ids[static_cast<size_t>(i)]);
        if (t >= weights.size() || weights[t] == 0) continue;
        const int16_t second = table_->second_byte[t];
        if (!table_->single_byte[t] &&
            ((second >= 0 && !SecondBytes(f)[static_cast<size_t>(second)]) ||
             !matcher_.WouldAccept(table_->pieces[t], &scratch_))) {
          continue;
        }
        kept_.emplace_back(t, weights[t]);
      }
    }
    if (end_ok) {
      for (int32_t id : table_->end_ids) {
        const auto t = static_cast<size_t>(id);
        if (t < weights.size()) kept_.emplace_back(t, weights[t]);
      }
    }
    std::fill(weights.begin(), weights.end(), 0.0f);
    for (const auto& [t, w] : kept_) weights[t] = w;
  }
  static constexpr size_t kFewFirstBytes = 64;

  // The bytes that may follow `first` (an allowed first byte). Worth its 256 trials only for a
  // byte that begins many tokens (' ' begins half of a BPE vocabulary, and most such tokens
  // fail at their second byte outside strings); for the others every byte is let through to
  // the token's own trial.
  const std::bitset<256>& SecondBytes(int16_t first) const {
    static const std::bitset<256> kAll = std::bitset<256>().set();
    const auto b = static_cast<size_t>(first);
    if (table_->multi_byte_tokens_by_first[b] < kSecondByteTableMinTokens) return kAll;
    if (!second_bytes_ready_[b]) {
      char pair[2] = {static_cast<char>(first), 0};
      for (int c = 0; c < 256; ++c) {
        pair[1] = static_cast<char>(c);
        second_bytes_[b][static_cast<size_t>(c)] =
            matcher_.WouldAccept(std::string_view(pair, 2), &scratch_);
      }
      second_bytes_ready_[b] = true;
    }
    return second_bytes_[b];
  }
  static constexpr int32_t kSecondByteTableMinTokens = 1024;

  std::shared_ptr<const TokenTable> table_;
  M matcher_;
  mutable M scratch_;  // trials of candidate tokens
  bool broken_ = false;
  // Which bytes may come next (a cache of Allows, rebuilt after each accepted token).
  mutable std::bitset<256> first_bytes_;
  mutable bool first_bytes_ready_ = false;
  // SecondBytes' tables, by first byte (built on demand, dropped after each accepted token).
  mutable std::array<std::bitset<256>, 256> second_bytes_;
  mutable std::bitset<256> second_bytes_ready_;
  mutable std::vector<std::pair<size_t, float>> kept_;  // RestrictByFirstByte's survivors
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
  t->plain_length.resize(n);
  t->second_byte.assign(n, -1);
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
    const bool plain = !piece.empty() && std::all_of(piece.begin(), piece.end(), [](char ch) {
      const auto c = static_cast<unsigned char>(ch);
      return c >= 0x20 && c <= 0x7E && c != '"' && c != '\\';
    });
    t->plain_length[id] =
        plain ? static_cast<uint16_t>(std::min<size_t>(piece.size(), 65535)) : uint16_t{0};
    if (t->first_byte[id] >= 0 && piece.size() >= 2) {
      t->second_byte[id] = static_cast<unsigned char>(piece[1]);
      ++t->multi_byte_tokens_by_first[static_cast<unsigned char>(piece[0])];
    }
    if (t->first_byte[id] == kEndToken) t->end_ids.push_back(id);
  }
  std::array<int32_t, 256> count{};
  for (int32_t id = 0; id < n; ++id) {
    if (t->first_byte[id] >= 0) ++count[static_cast<size_t>(t->first_byte[id])];
  }
  for (size_t b = 0; b < 256; ++b) t->by_first_offsets[b + 1] = t->by_first_offsets[b] + count[b];
  t->by_first_ids.resize(static_cast<size_t>(t->by_first_offsets[256]));
  std::array<int32_t, 256> next{};
  std::copy(t->by_first_offsets.begin(), t->by_first_offsets.end() - 1, next.begin());
  for (int32_t id = 0; id < n; ++id) {
    if (t->first_byte[id] >= 0) {
      t->by_first_ids[static_cast<size_t>(next[static_cast<size_t>(t->first_byte[id])]++)] = id;
    }
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
    std::shared_ptr<const TokenTable> table, int max_calls,
    engine::SamplingParams::ToolFormat format) {
  return std::make_unique<ByteConstraint<ToolCallMatcher>>(
      std::move(table), ToolCallMatcher(std::move(call_schema), required, max_calls, format));
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
                                table(), sampling.max_tool_calls, sampling.tool_format);
}

}  // namespace tandem::structured
