// What a sampler asks of a constraint on its output (structured output: a JSON schema, a tool
// call): whether a token may come next, and the token that did.
#pragma once

#include <cstdint>

namespace tandem::engine {

// One per sequence, driven by its sampler; not thread-safe.
class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // Whether `token` may follow the output so far (end-of-generation tokens: only once the output
  // is complete).
  virtual bool Allows(int32_t token) const = 0;
  // Records the token that was drawn (an allowed one, or one drawn elsewhere and resumed).
  virtual void Accept(int32_t token) = 0;
  // The output is complete and nothing but its end may follow: the request can finish.
  virtual bool Finished() const = 0;
};

}  // namespace tandem::engine
