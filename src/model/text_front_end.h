// What turns text into tokens and back for a model: its tokenizer and chat template, read from
// the GGUF metadata without touching the weights (the engine and the conductor both need it).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "model/chat_template.h"
#include "model/gguf.h"
#include "model/model_config.h"
#include "model/tokenizer.h"

namespace tandem::model {

struct TextFrontEnd {
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;  // empty when the model has none tandem knows
  std::string chat_template_error;            // why chat_template is empty
};

// InvalidArgument when the vocabulary's size differs from config.vocab_size (embedding rows).
// An unknown or missing chat template is not an error: chat_template_error says why.
StatusOr<TextFrontEnd> LoadTextFrontEnd(const GgufFile& file, const ModelConfig& config);

}  // namespace tandem::model
