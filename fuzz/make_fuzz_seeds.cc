// Writes the seeds that are better produced by the code than checked in, so that they follow
// the formats as they change: DIR/gguf (small GGUF files shaped like the two shipped models: a
// Llama with a byte-level BPE vocabulary and a ChatML template, a Gemma 3 with a SentencePiece
// vocabulary and byte tokens, one tensor each), DIR/worker_protocol (each control-protocol
// document as the code serializes it, with its selector byte) and DIR/tcp_listener (framed
// write, read and notify messages for the fuzzer's one segment "seg") and DIR/ssd_tier (a block
// file as the SSD tier writes it).
//   make_fuzz_seeds DIR   (DIR/gguf, DIR/worker_protocol, DIR/tcp_listener and DIR/ssd_tier
//                          must exist)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cluster/protocol.h"
#include "model/gguf_writer.h"
#include "store/ssd_tier.h"
#include "transfer/tcp_transport_wire_internal.h"
#include "transfer/transfer_engine.h"

namespace {

using tandem::DType;
using tandem::model::GgufWriter;

void Geometry(GgufWriter& w, const std::string& arch, int vocab) {
  w.SetString("general.architecture", arch);
  w.SetString("general.name", "fuzz-seed");
  w.SetUint32(arch + ".block_count", 1);
  w.SetUint32(arch + ".embedding_length", 32);
  w.SetUint32(arch + ".feed_forward_length", 64);
  w.SetUint32(arch + ".attention.head_count", 2);
  w.SetUint32(arch + ".attention.head_count_kv", 1);
  w.SetUint32(arch + ".attention.key_length", 16);
  w.SetUint32(arch + ".attention.value_length", 16);
  w.SetUint32(arch + ".context_length", 64);
  w.SetUint32(arch + ".rope.dimension_count", 16);
  w.SetFloat32(arch + ".rope.freq_base", 10000.0f);
  w.SetFloat32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
  w.SetUint32(arch + ".vocab_size", static_cast<uint32_t>(vocab));
  // Q8_0 embedding rows of 32 values: 34 bytes each (zero scale, zero values).
  if (!w.AddTensor("token_embd.weight", DType::kQ8_0, {32, vocab},
                   std::vector<uint8_t>(static_cast<size_t>(vocab) * 34, 0))
           .ok()) {
    std::fprintf(stderr, "make_fuzz_seeds: cannot add the embedding\n");
  }
}

GgufWriter BpeModel() {
  std::vector<std::string> tokens;
  for (char c = '!'; c <= '~'; ++c) tokens.emplace_back(1, c);  // byte-level: printable ASCII
  tokens.push_back("\xc4\xa0");                                 // byte-level space
  tokens.push_back("ab");
  tokens.push_back("<|im_start|>");
  tokens.push_back("<|im_end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types[types.size() - 1] = types[types.size() - 2] = 3;  // control
  GgufWriter w;
  Geometry(w, "llama", static_cast<int>(tokens.size()));
  w.SetString("tokenizer.ggml.model", "gpt2");
  w.SetString("tokenizer.ggml.pre", "smollm");
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", types);
  w.SetStringArray("tokenizer.ggml.merges", {"a b"});
  w.SetUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(tokens.size() - 2));
  w.SetUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(tokens.size() - 1));
  w.SetBool("tokenizer.ggml.add_bos_token", false);
  w.SetString("tokenizer.chat_template",
              "{% for message in messages %}{% if loop.first and messages[0]['role'] != "
              "'system' %}{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}{% endif %}"
              "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
              "'<|im_end|>' + '\\n'}}{% endfor %}");
  return w;
}

GgufWriter SpmModel() {
  std::vector<std::string> tokens = {"<pad>", "<eos>", "<bos>", "<unk>"};
  std::vector<int32_t> types = {3, 3, 3, 2};
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
  }
  for (const char* piece : {"\xe2\x96\x81",
                            "\xe2\x96\x81"
                            "a",
                            "a", "b", "ab", "<start_of_turn>", "<end_of_turn>"}) {
    tokens.push_back(piece);
    types.push_back(tokens.back()[0] == '<' ? 3 : 1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t i = 260; i < scores.size(); ++i) scores[i] = -static_cast<float>(i - 259);
  GgufWriter w;
  Geometry(w, "gemma3", static_cast<int>(tokens.size()));
  w.SetUint32("gemma3.attention.sliding_window", 8);
  w.SetString("tokenizer.ggml.model", "llama");
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetInt32Array("tokenizer.ggml.token_type", types);
  w.SetFloat32Array("tokenizer.ggml.scores", scores);
  w.SetUint32("tokenizer.ggml.bos_token_id", 2);
  w.SetUint32("tokenizer.ggml.eos_token_id", 1);
  w.SetUint32("tokenizer.ggml.unknown_token_id", 3);
  w.SetUint32("tokenizer.ggml.padding_token_id", 0);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetBool("tokenizer.ggml.add_space_prefix", false);
  return w;
}

bool WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
  return static_cast<bool>(out);
}

// Selector bytes as fuzz_worker_protocol.cc reads them.
std::vector<std::string> ProtocolSeeds() {
  using namespace tandem::cluster;
  auto doc = [](int selector, const std::string& json) {
    return std::string(1, static_cast<char>(selector)) + json;
  };
  WorkerInfo info;
  info.name = "decode-0";
  info.role = Role::kDecode;
  info.host = "127.0.0.1";
  info.port = 9000;
  info.kv_segment = "decode-0/kv";
  info.block_tokens = 16;
  info.n_layers = 30;
  WorkerStats stats;
  stats.cached_block_keys = {1, 2, 3};
  DecodeCall decode;
  decode.id = "r1";
  decode.prompt_tokens = {1, 2, 3};
  decode.sampling.logit_bias = {{5, -1.5f}};
  decode.sampling.json_schema = R"({"type":"object"})";
  PrefillCall prefill;
  prefill.id = "r2";
  prefill.prompt_tokens = {4, 5};
  prefill.target.segment = "decode-0/kv";
  prefill.target.blocks = {0, 1};
  prefill.target.window_blocks = {-1, 0};
  PrefillResult result;
  result.first_token.token = 7;
  DecodeEvent token;
  token.kind = DecodeEvent::Kind::kToken;
  token.token.token = 9;
  DecodeEvent finish;
  finish.kind = DecodeEvent::Kind::kFinish;
  DecodeEvent error;
  error.kind = DecodeEvent::Kind::kError;
  error.error = tandem::Unavailable("decode worker going away");
  RoleChange change;
  change.role = Role::kPrefill;
  change.reason = "planner";
  RoleChangeResult changed;
  tandem::transfer::SegmentDescriptor segment;
  segment.name = "decode-0/kv";
  segment.size = 1 << 20;
  segment.tcp_endpoint = "127.0.0.1:9100";
  return {doc(0, info.ToJson()),
          doc(1, stats.ToJson()),
          doc(2, decode.ToJson()),
          doc(3, prefill.ToJson()),
          doc(4, result.ToJson()),
          doc(5, token.ToJson()),
          doc(5, finish.ToJson()),
          doc(5, error.ToJson()),
          doc(6, change.ToJson()),
          doc(7, changed.ToJson()),
          doc(8, segment.ToJson()),
          doc(9, info.cost.ToJson()),
          doc(10, ErrorJson(tandem::NotFound("no such request")))};
}

std::string Frame(tandem::transfer::wire::MsgType type, uint64_t offset, const std::string& payload,
                  const std::string& from = "") {
  namespace wire = tandem::transfer::wire;
  wire::Header h;
  h.type = type;
  h.id = 1;
  h.offset = offset;
  h.length = type == wire::MsgType::kRead ? 64 : payload.size();
  h.name_len = 3;
  h.from_len = static_cast<uint32_t>(from.size());
  uint8_t hb[wire::kHeaderBytes];
  wire::Encode(h, hb);
  return std::string(reinterpret_cast<char*>(hb), sizeof(hb)) + "seg" + from + payload;
}

std::vector<std::string> TcpSeeds() {
  using tandem::transfer::wire::MsgType;
  const std::string write = Frame(MsgType::kWrite, 128, "0123456789abcdef");
  const std::string read = Frame(MsgType::kRead, 0, "");
  const std::string notify = Frame(MsgType::kNotify, 0, "kv ready", "prefill-0");
  // Byte 0 even: the harness completes the token handshake first (fuzz_tcp_listener.cc).
  const std::string member(1, '\0');
  return {member + write, member + read, member + notify, member + write + read + notify,
          std::string(1, '\1') + "TDXA0123456789abcdef"};
}

}  // namespace

// A block file of the SSD tier as the tier writes it: key "ns/k" (fuzz_ssd_tier's key), 64
// bytes, written by a real SsdTier, copied to DIR/seed.
bool SsdSeed(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path tmp = fs::path(dir) / "tier";
  auto tier = tandem::store::SsdTier::Open({tmp.string(), 1 << 20});
  if (!tier.ok()) return false;
  std::vector<uint8_t> bytes(64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  if (!(*tier)->Offer("ns/k", bytes.data(), bytes.size())) return false;
  (*tier)->Flush();
  tier->reset();
  bool copied = false;
  for (const auto& e : fs::directory_iterator(tmp)) {
    if (e.path().extension() != ".kv") continue;
    std::error_code ec;
    fs::copy_file(e.path(), fs::path(dir) / "seed", fs::copy_options::overwrite_existing, ec);
    copied = !ec;
  }
  fs::remove_all(tmp);
  return copied;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (const auto& [name, writer] :
       {std::pair{"llama_bpe.gguf", BpeModel()}, std::pair{"gemma3_spm.gguf", SpmModel()}}) {
    if (auto st = writer.WriteFile(dir + "/gguf/" + name); !st.ok()) {
      std::fprintf(stderr, "make_fuzz_seeds: %s\n", st.ToString().c_str());
      return 1;
    }
  }
  bool ok = true;
  const std::vector<std::string> protocol = ProtocolSeeds();
  for (size_t i = 0; i < protocol.size(); ++i) {
    ok = ok && WriteBytes(dir + "/worker_protocol/seed" + std::to_string(i), protocol[i]);
  }
  const std::vector<std::string> tcp = TcpSeeds();
  for (size_t i = 0; i < tcp.size(); ++i) {
    ok = ok && WriteBytes(dir + "/tcp_listener/seed" + std::to_string(i), tcp[i]);
  }
  ok = ok && SsdSeed(dir + "/ssd_tier");
  if (!ok) std::fprintf(stderr, "make_fuzz_seeds: cannot write under %s\n", dir.c_str());
  return ok ? 0 : 1;
}
