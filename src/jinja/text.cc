#include "jinja/text.h"

#include <cctype>

namespace tandem::jinja {
namespace {

bool IsWs(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Case mapping of the scripts chat templates meet (Python's str.upper / lower for ASCII, Latin-1,
// Latin Extended-A, Greek and Cyrillic; other code points are left as they are).
uint32_t UpperCp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}
uint32_t LowerCp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

uint32_t DecodeCp(const std::string& cp) {
  const auto b = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(cp[i])); };
  switch (cp.size()) {
    case 1: return b(0);
    case 2: return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3: return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

// Maps each code point: upper (ß becomes "SS"), lower, or by position (title / capitalize).
enum class CaseMode { kUpper, kLower, kTitle, kCapitalize };
std::string MapCase(const std::string& s, CaseMode mode) {
  std::string out;
  bool prev_cased = false, first = true;
  for (const std::string& cp : CodePoints(s)) {
    const uint32_t c = DecodeCp(cp);
    const bool cased = UpperCp(c) != c || LowerCp(c) != c || c == 0xDF;
    bool up = mode == CaseMode::kUpper;
    if (mode == CaseMode::kTitle) up = cased && !prev_cased;
    if (mode == CaseMode::kCapitalize) up = first;
    first = false;
    if (mode == CaseMode::kTitle) prev_cased = cased;
    if (up && c == 0xDF) {
      out += mode == CaseMode::kUpper ? "SS" : "Ss";
    } else if (c >= 0x10000 || (cp.size() == 1 && c >= 0x80)) {
      out += cp;  // beyond the mapped scripts, or a stray byte: as it is
    } else {
      AppendUtf8(up ? UpperCp(c) : LowerCp(c), &out);
    }
  }
  return out;
}

}  // namespace

std::string Lower(const std::string& s) { return MapCase(s, CaseMode::kLower); }
std::string Upper(const std::string& s) { return MapCase(s, CaseMode::kUpper); }
std::string Capitalize(const std::string& s) { return MapCase(s, CaseMode::kCapitalize); }
std::string Title(const std::string& s) { return MapCase(s, CaseMode::kTitle); }

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  std::string out;
  size_t pos = 0;
  int64_t done = 0;
  if (from.empty()) {  // Python inserts `to` around every character
    for (const std::string& cp : CodePoints(s)) {
      if (count >= 0 && done >= count) {
        out += cp;
        continue;
      }
      out += to + cp;
      ++done;
    }
    return (count < 0 || done < count) ? out + to : out;
  }
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos).append(to);
    pos = hit + from.size();
    ++done;
  }
  return out + s.substr(pos);
}

List Split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && IsWs(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = s.substr(i);
        while (!rest.empty() && IsWs(rest.back())) rest.pop_back();
        out.emplace_back(rest);
        return out;
      }
      size_t j = i;
      while (j < s.size() && !IsWs(s[j])) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->str();
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const size_t hit = s.find(d, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + d.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::string Strip(const std::string& s, const std::string& chars, bool left, bool right) {
  const auto drop = [&](char c) {
    return chars.empty() ? IsWs(c) : chars.find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e && drop(s[b])) ++b;
  }
  if (right) {
    while (e > b && drop(s[e - 1])) --e;
  }
  return s.substr(b, e - b);
}

}  // namespace tandem::jinja
