#include "generate_command.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "app_util.h"
#include "common/logging.h"
#include "engine/engine.h"
#include "flags.h"

namespace tandem::app {

CLI::App* AddGenerateCommand(CLI::App& app, GenerateFlags& f) {
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (stdout: text only)");
  AddModelFlag(cmd, f.model);
  cmd->add_option("--prompt", f.prompt, "Prompt text")->required();
  cmd->add_option("--max-tokens", f.max_tokens, "Tokens to generate")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--temperature", f.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  cmd->add_option("--top-k", f.top_k, "Keep the k most likely tokens (0 = off)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-p", f.top_p, "Nucleus sampling mass (1 = off)")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--min-p", f.min_p, "Drop tokens below min-p x the top probability")
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--seed", f.seed, "Sampling seed");
  cmd->add_flag("--chat", f.chat, "Wrap the prompt as a user message with the chat template");
  cmd->add_flag("--ignore-eos", f.ignore_eos, "Keep generating past end-of-generation tokens");
  cmd->add_option("--threads", f.threads, "Worker threads (default: all cores)")
      ->check(CLI::Range(1, 256));
  return cmd;
}

int RunGenerate(const GenerateFlags& f) {
  auto log = GetLogger("generate");
  engine::EngineOptions opts;
  opts.model_path = f.model.empty() ? DefaultModelPath() : f.model;
  opts.threads = f.threads > 0 ? f.threads : DefaultThreads();
  opts.max_sequences = 1;  // one sequence: sliding layers need one window
  auto loaded = engine::Engine::Load(opts);
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  engine::Engine& eng = **loaded;
  const model::Tokenizer& tok = eng.tokenizer();
  std::vector<int32_t> prompt;
  if (f.chat) {
    if (eng.chat_template() == nullptr) {
      std::fprintf(stderr, "error: --chat: %s\n", eng.chat_template_error().c_str());
      return 1;
    }
    auto text = eng.chat_template()->Apply({{"user", f.prompt}}, true);
    if (!text.ok()) {
      std::fprintf(stderr, "error: --chat: %s\n", text.status().message().c_str());
      return 1;
    }
    prompt = tok.Encode(*text, tok.add_bos(), /*parse_special=*/true);
  } else {
    prompt = tok.Encode(f.prompt, tok.add_bos(), /*parse_special=*/false);
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "error: the prompt is empty after tokenization\n");
    return 1;
  }
  engine::GenerateOptions g;
  g.max_tokens = f.max_tokens;
  g.ignore_eos = f.ignore_eos;
  g.sampling = {f.temperature, f.top_k, f.top_p, f.min_p, f.seed};
  model::StreamDecoder decoder(&tok);
  auto result = eng.Generate(prompt, g, [&](int32_t id) {
    if (!f.ignore_eos && tok.IsEndOfGeneration(id)) return true;
    const std::string piece = decoder.Push(id);
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  const std::string rest = decoder.Flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  if (!result.ok()) {
    std::fprintf(stderr, "error: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const size_t n = result->tokens.size();
  std::fprintf(stderr,
               "prompt: %zu tokens in %.3f s (%.1f tok/s); generated: %zu tokens in %.3f s "
               "(%.1f tok/s); finish: %s; threads: %d\n",
               prompt.size(), result->prefill_seconds, prompt.size() / result->prefill_seconds, n,
               result->decode_seconds, n > 1 ? (n - 1) / result->decode_seconds : 0.0,
               result->finish_reason.c_str(), opts.threads);
  return 0;
}

}  // namespace tandem::app
