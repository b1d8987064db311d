// What a sampler asks of a constraint on its output (structured output: a JSON schema, a tool
// call): whether a token may come next, and the token that did.
#pragma once

#include <cstdint>
#include <span>

namespace tandem::engine {

// One per sequence, driven by its sampler; not thread-safe.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether `token` may follow the output so far (end-of-generation tokens: only once the output
  // is complete).
  virtual bool Allows(int32_t token) const = 0;
  // Zeroes weights[t] of every token t it does not allow (weights: one per vocabulary entry);
  // the same answers as Allows, in one pass (implementations make it cheap).
  virtual void Restrict(std::span<float> weights) const {
    for (size_t t = 0; t < weights.size(); ++t) {
      if (weights[t] != 0 && !Allows(static_cast<int32_t>(t))) weights[t] = 0;
    }
  }
  // Records the token that was drawn (an allowed one, or one drawn elsewhere and resumed).
  virtual void Accept(int32_t token) = 0;
  // The output is complete and nothing but its end may follow: the request can finish.
  virtual bool Finished() const = 0;
};

}  // namespace tandem::engine
