#include "model/text_front_end.h"

namespace tandem::model {
namespace {

std::string TokenText(const VocabData& vocab, int32_t id) {
  return id >= 0 && static_cast<size_t>(id) < vocab.tokens.size() ? vocab.tokens[id] : "";
}

}  // namespace

StatusOr<TextFrontEnd> LoadTextFrontEnd(const GgufFile& file, const ModelConfig& config) {
  TANDEM_ASSIGN_OR_RETURN(VocabData vocab, ReadVocab(file));
  if (static_cast<int>(vocab.tokens.size()) != config.vocab_size) {
    return InvalidArgument("tokenizer has " + std::to_string(vocab.tokens.size()) +
                           " tokens but the embedding has " + std::to_string(config.vocab_size) +
                           " rows");
  }
  TextFrontEnd fe;
  TANDEM_ASSIGN_OR_RETURN(fe.tokenizer, Tokenizer::Create(vocab));
  if (config.chat_template.empty() && config.architecture == "gemma3") {
    fe.chat_template = ChatTemplate::Gemma();  // the file has none; Gemma's format is known
  } else if (config.chat_template.empty()) {
    fe.chat_template_error = "the model has no tokenizer.chat_template";
  } else if (auto t = ChatTemplate::Parse(config.chat_template, TokenText(vocab, vocab.bos_id),
                                          TokenText(vocab, vocab.eos_id), vocab.add_bos);
             t.ok()) {
    fe.chat_template = *t;
  } else {
    fe.chat_template_error = t.status().message();
  }
  return fe;
}

}  // namespace tandem::model
