#include "structured/token_constraint.h"

#include "structured/json_matcher.h"

namespace tandem::structured {
namespace {

class JsonConstraint final : public engine::TokenConstraint {
 public:
  JsonConstraint(std::shared_ptr<const Schema> schema, std::shared_ptr<const TokenTable> table)
      : table_(std::move(table)), matcher_(std::move(schema)) {}

  bool Allows(int32_t token) const override {
    if (token < 0 || static_cast<size_t>(token) >= table_->pieces.size()) return false;
    if (table_->end[token]) return broken_ || matcher_.Complete();
    if (broken_ || matcher_.Closed() || table_->control[token]) return false;
    const std::string& piece = table_->pieces[token];
    if (piece.empty()) return false;
    JsonMatcher trial = matcher_;
    return trial.FeedAll(piece);
  }

  void Accept(int32_t token) override {
    if (token < 0 || static_cast<size_t>(token) >= table_->pieces.size()) return;
    if (table_->end[token]) return;
    // A token that does not fit (resumed from elsewhere) leaves only the end open.
    if (broken_ || !matcher_.FeedAll(table_->pieces[token])) broken_ = true;
  }

  bool Finished() const override { return matcher_.Closed(); }

 private:
  std::shared_ptr<const TokenTable> table_;
  JsonMatcher matcher_;
  bool broken_ = false;
};

}  // namespace

std::shared_ptr<const TokenTable> TokenTable::FromTokenizer(const model::Tokenizer& tokenizer) {
  auto t = std::make_shared<TokenTable>();
  const int32_t n = tokenizer.vocab_size();
  t->pieces.resize(n);
  t->end.resize(n);
  t->control.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    t->pieces[id] = tokenizer.TokenToPiece(id);
    t->end[id] = tokenizer.IsEndOfGeneration(id) ? 1 : 0;
    t->control[id] = tokenizer.IsControl(id) ? 1 : 0;
  }
  return t;
}

std::unique_ptr<engine::TokenConstraint> MakeJsonConstraint(
    std::shared_ptr<const Schema> schema, std::shared_ptr<const TokenTable> table) {
  return std::make_unique<JsonConstraint>(std::move(schema), std::move(table));
}

}  // namespace tandem::structured
