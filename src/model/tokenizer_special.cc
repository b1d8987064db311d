// Token attributes, end-of-generation set and special-token partition as llama.cpp's
// llama_vocab::impl::load and tokenizer_st_partition (llama-cpp-python 0.3.36) compute them.
#include <algorithm>
#include <array>
#include <map>
#include <unordered_map>

#include "model/tokenizer_internal.h"

namespace tandem::model::internal {
namespace {

// Roles llama.cpp finds by token text (llama-vocab.cpp, "auto-detect special tokens by text").
enum TextRole : uint32_t {
  kRoleEot = 1 << 0,     // special_eot_id candidates
  kRoleEom = 1 << 1,     // special_eom_id
  kRoleFimPre = 1 << 2,  // fill-in-the-middle prefix / suffix / middle / pad / repo / separator
  kRoleFimSuf = 1 << 3,
  kRoleFimMid = 1 << 4,
  kRoleFimPad = 1 << 5,
  kRoleFimRep = 1 << 6,
  kRoleFimSep = 1 << 7,
  kRoleEog = 1 << 8,         // always end generation
  kRoleGptOssUser = 1 << 9,  // gpt-oss: forced to user-defined
};

const std::unordered_map<std::string_view, uint32_t>& TextRoles() {
  static const auto* roles = [] {
    auto* m = new std::unordered_map<std::string_view, uint32_t>();
    auto add = [&](uint32_t role, std::initializer_list<std::string_view> texts) {
      for (std::string_view t : texts) (*m)[t] |= role;
    };
    add(kRoleEot,
        {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
         "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"});
    add(kRoleEom, {"<|eom_id|>"});
    add(kRoleFimPre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                      "▁<PRE>", "<|code_prefix|>", "<|prefix|>"});
    add(kRoleFimSuf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                      "▁<SUF>", "<|code_suffix|>", "<|suffix|>"});
    add(kRoleFimMid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                      "▁<MID>", "<|code_middle|>", "<|middle|>"});
    add(kRoleFimPad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
    add(kRoleFimRep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
    add(kRoleFimSep, {"<|file_sep|>"});
    add(kRoleEog, {"<|eot_id|>",
                   "<|im_end|>",
                   "<|end|>",
                   "<|return|>",
                   "<|call|>",
                   "<|flush|>",
                   "<|calls|>",
                   "<end_of_turn>",
                   "<|endoftext|>",
                   "</s>",
                   "<|eom_id|>",
                   "<EOT>",
                   "_<EOT>",
                   "[EOT]",
                   "[EOS]",
                   "<|end_of_text|>",
                   "<end_of_utterance>",
                   "<eos>",
                   "<turn|>",
                   "<|tool_response>",
                   "<｜end▁of▁sentence｜>",
                   "[e~["});
    add(kRoleGptOssUser, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"});
    return m;
  }();
  return *roles;
}

uint8_t AttrOfType(int32_t type) {
  switch (type) {
    case kTypeNormal: return kAttrNormal;
    case kTypeUnknown: return kAttrUnknown;
    case kTypeControl: return kAttrControl;
    case kTypeUserDefined: return kAttrUserDefined;
    case kTypeUnused: return kAttrUnused;
    case kTypeByte: return kAttrByte;
    default: return 0;  // undefined: llama.cpp renders nothing for it
  }
}

}  // namespace

StatusOr<VocabAttributes> AnalyzeVocab(const VocabData& v, int32_t eos_id) {
  const int32_t n = static_cast<int32_t>(v.tokens.size());
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    return InvalidArgument("tokenizer has " + std::to_string(n) + " tokens but " +
                           std::to_string(v.token_types.size()) + " token types");
  }
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos", v.bos_id},
                          {"eos", v.eos_id},
                          {"unknown", v.unk_id},
                          {"padding", v.pad_id}}) {
    if (id < -1 || id >= n) {
      return InvalidArgument(std::string(name) + " token id " + std::to_string(id) +
                             " is outside the vocabulary of " + std::to_string(n));
    }
  }

  VocabAttributes a;
  a.attrs.resize(n);
  a.eog.assign(n, 0);
  for (int32_t id = 0; id < n; ++id) {
    a.attrs[id] = AttrOfType(v.token_types.empty() ? kTypeNormal : v.token_types[id]);
  }

  // Tokens whose text has a role, in id order. Every candidate text starts with one of these
  // bytes, which keeps the scan of a 262k-token vocabulary to a byte test per token.
  const auto& roles = TextRoles();
  std::vector<std::pair<int32_t, uint32_t>> found;
  for (int32_t id = 0; id < n; ++id) {
    const std::string& t = v.tokens[id];
    if (t.empty()) continue;
    const unsigned char c = static_cast<unsigned char>(t[0]);
    if (c != '<' && c != '[' && c != '_' && c != 0xE2) continue;
    auto it = roles.find(t);
    if (it != roles.end()) found.emplace_back(id, it->second);
  }

  // One token per single-id role: llama.cpp takes the first candidate in its hash map's
  // iteration order; tandem takes the lowest id (they differ only for a vocabulary holding
  // two candidates of the same role).
  auto first_with = [&](uint32_t role) {
    for (auto [id, r] : found) {
      if (r & role) return id;
    }
    return int32_t{-1};
  };
  const int32_t eot = first_with(kRoleEot), eom = first_with(kRoleEom);
  const int32_t fim_pad = first_with(kRoleFimPad), fim_rep = first_with(kRoleFimRep),
                fim_sep = first_with(kRoleFimSep);
  for (int32_t id : {eot, eom, first_with(kRoleFimPre), first_with(kRoleFimSuf),
                     first_with(kRoleFimMid), fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) a.attrs[id] |= kAttrControl;
  }
  for (int32_t id : {fim_pad, fim_rep, fim_sep}) {
    if (id >= 0) a.eog[id] = 1;
  }
  for (auto [id, r] : found) {
    if (r & kRoleEog) {
      a.eog[id] = 1;
      a.attrs[id] |= kAttrControl;
    }
  }
  for (auto [id, r] : found) {
    if (r & kRoleGptOssUser) a.attrs[id] = kAttrUserDefined;
  }
  for (int32_t id : {eos_id, eot, eom}) {
    if (id >= 0 && id < n) a.eog[id] = 1;
  }

  // o200k_harmony / solar-open: '<|end|>' is not an end of generation there.
  bool has_return = false, has_call = false, has_flush = false, has_normal_s_marker = false;
  int32_t end_id = -1, s_id = -1;
  for (auto [id, r] : found) {
    if (!a.eog[id]) continue;
    const std::string& t = v.tokens[id];
    has_return |= t == "<|return|>";
    has_call |= t == "<|call|>" || t == "<|calls|>";
    has_flush |= t == "<|flush|>";
    has_normal_s_marker |= t == "<|tool_response>" || t == "<|plamo:eos|>";
    if (t == "<|end|>") end_id = id;
    if (t == "</s>") s_id = id;
  }
  if (end_id >= 0 && has_call && (has_return || has_flush)) {
    a.eog[end_id] = 0;
    a.attrs[end_id] = kAttrUserDefined;
  }
  // Gemma 4 and PLaMo: '</s>' is an ordinary token.
  if (s_id >= 0 && has_normal_s_marker) {
    a.eog[s_id] = 0;
    a.attrs[s_id] = kAttrNormal;
  }
  return a;
}

SpecialTokenSplitter::SpecialTokenSplitter(const std::vector<std::string>& texts,
                                           const std::vector<uint8_t>& attrs) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < static_cast<int32_t>(texts.size()); ++id) {
    if ((attrs[id] & (kAttrControl | kAttrUserDefined | kAttrUnknown)) && !texts[id].empty()) {
      ids.push_back(id);
    }
  }
  // llama.cpp sorts its cache with std::sort (not stable) from ascending ids; doing the same
  // keeps equal-length tokens in the same order as libstdc++ gives llama.cpp.
  std::sort(ids.begin(), ids.end(),
            [&](int32_t a, int32_t b) { return texts[a].size() > texts[b].size(); });
  std::map<uint32_t, int32_t> edges;  // node << 8 | byte -> child, while building
  terminal_.assign(1, -1);
  for (int32_t id : ids) {
    const int32_t k = static_cast<int32_t>(specials_.size());
    specials_.push_back({texts[id], id, !(attrs[id] & (kAttrControl | kAttrUnknown))});
    int32_t node = 0;
    for (unsigned char c : texts[id]) {
      const uint32_t key = static_cast<uint32_t>(node) << 8 | c;
      auto [it, inserted] = edges.emplace(key, static_cast<int32_t>(terminal_.size()));
      if (inserted) terminal_.push_back(-1);
      node = it->second;
    }
    terminal_[node] = k;  // texts are unique, so no other special ends here
  }
  edges_.reserve(edges.size());
  root_.fill(-1);
  for (auto [key, child] : edges) {
    edges_.push_back({key, child});
    if ((key >> 8) == 0) root_[key & 0xFF] = child;
  }
}

void SpecialTokenSplitter::FindPresent(std::string_view text, bool parse_special,
                                       std::vector<uint8_t>* present) const {
  present->assign(specials_.size(), 0);
  if (specials_.empty()) return;
  auto child = [&](int32_t node, unsigned char c) {
    const uint32_t key = static_cast<uint32_t>(node) << 8 | c;
    auto it = std::lower_bound(edges_.begin(), edges_.end(), key,
                               [](const Edge& e, uint32_t k) { return e.key < k; });
    return it != edges_.end() && it->key == key ? it->child : -1;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    int32_t node = root_[static_cast<unsigned char>(text[i])];
    for (size_t j = i + 1; node >= 0; ++j) {
      const int32_t k = terminal_[node];
      if (k >= 0 && (parse_special || specials_[k].always)) (*present)[k] = 1;
      if (j == text.size()) break;
      node = child(node, static_cast<unsigned char>(text[j]));
    }
  }
}

void SpecialTokenSplitter::Split(std::string_view text, bool parse_special,
                                 std::vector<Fragment>* out) const {
  out->clear();
  if (text.empty()) return;
  out->push_back({-1, 0, text.size()});
  std::vector<uint8_t> present;
  FindPresent(text, parse_special, &present);
  std::vector<Fragment> next;
  for (size_t k = 0; k < specials_.size(); ++k) {
    if (!present[k]) continue;
    const Special& sp = specials_[k];
    next.clear();
    for (const Fragment& f : *out) {
      if (f.id >= 0 || f.len < sp.text.size()) {
        next.push_back(f);
        continue;
      }
      const std::string_view raw = text.substr(f.off, f.len);
      size_t pos = 0;
      for (size_t hit; (hit = raw.find(sp.text, pos)) != std::string_view::npos;) {
        if (hit > pos) next.push_back({-1, f.off + pos, hit - pos});
        next.push_back({sp.id, 0, 0});
        pos = hit + sp.text.size();
      }
      if (pos < raw.size()) next.push_back({-1, f.off + pos, raw.size() - pos});
    }
    out->swap(next);
  }
}

}  // namespace tandem::model::internal
