#include "structured/json_matcher.h"

#include <utility>

namespace tandem::structured {
namespace {

// Object states.
constexpr uint8_t kObjOpen = 0;        // after '{': a key or '}'
constexpr uint8_t kObjNeedKey = 1;     // after ',': a key
constexpr uint8_t kObjAfterKey = 2;    // a ':'
constexpr uint8_t kObjAfterValue = 3;  // ',' or '}'
// Array states.
constexpr uint8_t kArrOpen = 0;        // after '[': a value or ']'
constexpr uint8_t kArrAfterValue = 1;  // ',' or ']'
constexpr uint8_t kArrNeedValue = 2;   // after ',': a value
// Number states; kNum{Zero,Int,Frac,Exp} may end the number.
enum : uint8_t {
  kNumStart,
  kNumMinus,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumE,
  kNumESign,
  kNumExp
};
// String states: kStrPlain, kStrEscape (after '\'), then 4 hex digits of \u.
constexpr uint8_t kStrPlain = 0;
constexpr uint8_t kStrEscape = 1;
constexpr uint8_t kStrHex0 = 2;

bool IsWhitespace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsHex(unsigned char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
int BitIndex(uint8_t kind) {
  int i = 0;
  while (i < 7 && kind != (1u << i)) ++i;
  return i;
}

}  // namespace

JsonMatcher::JsonMatcher(std::shared_ptr<const Schema> schema) : schema_(std::move(schema)) {
  Frame root;
  root.node = schema_->root;
  stack_.push_back(root);
}

bool JsonMatcher::FeedAll(std::string_view bytes) {
  for (char c : bytes) {
    if (!Feed(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

void JsonMatcher::CopyStateTo(JsonMatcher* other) const {
  other->stack_.assign(stack_.begin(), stack_.end());
  other->buf_.assign(buf_);
  other->ws_run_ = ws_run_;
  other->ws_newline_ = ws_newline_;
  other->closed_ = closed_;
}

bool JsonMatcher::WouldAccept(std::string_view bytes, JsonMatcher* scratch) const {
  CopyStateTo(scratch);
  return scratch->FeedAll(bytes);
}

bool JsonMatcher::Feed(unsigned char c) {
  // A number or literal ends at the first byte that cannot extend it; that byte then goes to the
  // enclosing frame (at most twice round: the frame below is structural).
  for (int round = 0; round < 3; ++round) {
    if (closed_) return IsWhitespace(c) && Whitespace(c);
    Frame& f = stack_.back();
    bool handled = true;
    switch (f.type) {
      case Type::kString: return StringByte(f, c);
      case Type::kNumber:
        if (!NumberByte(f, c, &handled)) return false;
        if (handled) return true;
        continue;
      case Type::kLiteral:
        if (!LiteralByte(f, c, &handled)) return false;
        if (handled) return true;
        continue;
      default: break;
    }
    if (IsWhitespace(c)) return Whitespace(c);
    ws_run_ = 0;
    ws_newline_ = false;
    switch (f.type) {
      case Type::kValue: return StartValue(f, c);
      case Type::kObject: return ObjectByte(f, c);
      case Type::kArray: return ArrayByte(f, c);
      default: return false;
    }
  }
  return false;
}

bool JsonMatcher::Whitespace(unsigned char c) {
  if (c == '\n' || c == '\r') {
    if (ws_newline_) return false;
    ws_newline_ = true;
  }
  return ++ws_run_ <= kMaxWhitespaceRun;
}

bool JsonMatcher::Complete() const {
  if (closed_) return true;
  if (stack_.size() != 1) return false;
  const Frame& f = stack_.back();
  if (f.type == Type::kNumber) {
    return f.state == kNumZero || f.state == kNumInt || f.state == kNumFrac || f.state == kNumExp;
  }
  if (f.type == Type::kLiteral) {
    for (const std::string& t : LiteralTexts(f)) {
      if (t == buf_) return true;
    }
  }
  return false;
}

bool JsonMatcher::StartValue(Frame& f, unsigned char c) {
  const SchemaNode& n = node(f.node);
  ws_run_ = 0;
  ws_newline_ = false;
  if (!n.enum_texts.empty()) {
    f.type = Type::kLiteral;
    f.literal_enum = true;
    buf_.clear();
    bool handled = true;
    return LiteralByte(f, c, &handled) && handled;
  }
  uint8_t kind = 0;
  if (c == '{') {
    kind = kObject;
  } else if (c == '[') {
    kind = kArray;
  } else if (c == '"') {
    kind = kString;
  } else if (c == '-' || IsDigit(c)) {
    kind = (n.kinds & kNumber) ? kNumber : kInteger;
  } else if (c == 't' || c == 'f') {
    kind = kBoolean;
  } else if (c == 'n') {
    kind = kNull;
  }
  if (kind == 0 || !(n.kinds & kind)) return false;
  const int branch = n.kind_node[BitIndex(kind)];
  if (branch >= 0) {
    f.node = branch;
    if (!node(branch).enum_texts.empty()) return false;  // refused at compile time
  }
  switch (kind) {
    case kObject:
      f.type = Type::kObject;
      f.state = kObjOpen;
      f.used = 0;
      return true;
    case kArray:
      f.type = Type::kArray;
      f.state = kArrOpen;
      f.count = 0;
      return true;
    case kString:
      f.type = Type::kString;
      f.state = kStrPlain;
      f.count = 0;
      f.is_key = false;
      return true;
    case kNumber:
    case kInteger: {
      f.type = Type::kNumber;
      f.state = kNumStart;
      f.count = 0;
      f.integer = kind == kInteger;
      bool handled = true;
      return NumberByte(f, c, &handled) && handled;
    }
    default: {
      f.type = Type::kLiteral;
      f.literal_enum = false;
      buf_.clear();
      bool handled = true;
      return LiteralByte(f, c, &handled) && handled;
    }
  }
}

void JsonMatcher::EndValue() {
  // The value of an object's discriminating property (x-tandem-variants) picks the variant.
  if (stack_.size() >= 2 && stack_.back().type == Type::kLiteral && stack_.back().literal_enum) {
    Frame& object = stack_[stack_.size() - 2];
    const SchemaNode& n = node(object.node);
    if (object.type == Type::kObject && n.variant_on >= 0 && object.key_prop == n.variant_on) {
      const auto& texts = node(stack_.back().node).enum_texts;
      for (size_t i = 0; i < texts.size(); ++i) {
        if (texts[i] == buf_) object.variant = static_cast<int>(i);
      }
    }
  }
  stack_.pop_back();
  if (stack_.empty()) {
    closed_ = true;
    return;
  }
  Frame& parent = stack_.back();
  parent.state = parent.type == Type::kObject ? kObjAfterValue : kArrAfterValue;
}

bool JsonMatcher::KeyAllowed(const Frame& object, std::string_view key, bool whole) const {
  const SchemaNode& n = node(object.node);
  if (n.ordered) {  // only the next property in declared order
    for (size_t i = 0; i < n.properties.size(); ++i) {
      if (object.used & (uint64_t{1} << i)) continue;
      const std::string& name = n.properties[i].name;
      return whole ? name == key : name.compare(0, key.size(), key) == 0;
    }
    return false;
  }
  bool names_used_property = false;
  for (size_t i = 0; i < n.properties.size(); ++i) {
    const std::string& name = n.properties[i].name;
    const bool matches = whole ? name == key : name.compare(0, key.size(), key) == 0;
    if (!matches) continue;
    if (object.used & (uint64_t{1} << i)) {
      names_used_property = names_used_property || name == key;
      continue;
    }
    return true;
  }
  if (!n.additional_allowed) return false;
  return !(whole && names_used_property);  // a property appears once
}

bool JsonMatcher::MoreKeysPossible(const Frame& object) const {
  const SchemaNode& n = node(object.node);
  if (n.additional_allowed && !n.ordered) return true;
  for (size_t i = 0; i < n.properties.size(); ++i) {
    if (!(object.used & (uint64_t{1} << i))) return true;
  }
  return false;
}

bool JsonMatcher::RequiredDone(const Frame& object) const {
  const SchemaNode& n = node(object.node);
  for (size_t i = 0; i < n.properties.size(); ++i) {
    if (n.properties[i].required && !(object.used & (uint64_t{1} << i))) return false;
  }
  return true;
}

bool JsonMatcher::ObjectByte(Frame& f, unsigned char c) {
  switch (f.state) {
    case kObjOpen:
    case kObjNeedKey:
      if (c == '"') {
        if (!MoreKeysPossible(f)) return false;
        buf_.clear();
        Frame key;
        key.type = Type::kString;
        key.is_key = true;
        stack_.push_back(key);  // f is not used after this
        return true;
      }
      if (c == '}' && f.state == kObjOpen && RequiredDone(f)) {
        EndValue();
        return true;
      }
      return false;
    case kObjAfterKey: {
      if (c != ':') return false;
      const SchemaNode& n = node(f.node);
      Frame value;
      value.node =
          f.key_prop >= 0 ? n.properties[static_cast<size_t>(f.key_prop)].node : n.additional_node;
      if (f.key_prop >= 0 && f.key_prop == n.variant_property && f.variant >= 0) {
        value.node = n.variant_nodes[static_cast<size_t>(f.variant)];
      }
      f.state = kObjAfterValue;
      stack_.push_back(value);
      return true;
    }
    case kObjAfterValue:
      if (c == ',' && MoreKeysPossible(f)) {
        f.state = kObjNeedKey;
        return true;
      }
      if (c == '}' && RequiredDone(f)) {
        EndValue();
        return true;
      }
      return false;
  }
  return false;
}

bool JsonMatcher::ArrayByte(Frame& f, unsigned char c) {
  const SchemaNode& n = node(f.node);
  if (f.state == kArrAfterValue) {
    if (c == ',' && (n.max_items < 0 || f.count < n.max_items)) {
      f.state = kArrNeedValue;
      return true;
    }
    if (c == ']' && f.count >= n.min_items) {
      EndValue();
      return true;
    }
    return false;
  }
  if (c == ']') {
    if (f.state != kArrOpen || n.min_items > 0) return false;
    EndValue();
    return true;
  }
  if (n.max_items >= 0 && f.count >= n.max_items) return false;
  ++f.count;
  f.state = kArrAfterValue;
  Frame item;
  item.node = n.items_node;
  stack_.push_back(item);  // f is not used after this
  return StartValue(stack_.back(), c);
}

size_t JsonMatcher::PlainStringRoom() const {
  if (closed_ || stack_.empty()) return 0;
  const Frame& f = stack_.back();
  if (f.type != Type::kString || f.state != kStrPlain || f.utf8_left != 0 || f.want_low_surrogate) {
    return 0;
  }
  if (f.is_key) {  // any key of an object that allows undeclared ones, up to kMaxKeyBytes
    const SchemaNode& object = node(stack_[stack_.size() - 2].node);
    if (object.ordered || !object.additional_allowed) return 0;
    const size_t max_key = static_cast<size_t>(kMaxKeyBytes);
    return buf_.size() < max_key ? max_key - buf_.size() : 0;
  }
  const int max_length = node(f.node).max_length;
  if (max_length < 0) return SIZE_MAX;
  return max_length > f.count ? static_cast<size_t>(max_length - f.count) : 0;
}

JsonMatcher::StringScan JsonMatcher::ScanStringByte(Frame& f, unsigned char c) {
  if (f.utf8_left > 0) {
    if (c < f.utf8_lo || c > f.utf8_hi) return StringScan::kBad;
    --f.utf8_left;
    f.utf8_lo = 0x80;
    f.utf8_hi = 0xBF;
    return StringScan::kContinue;
  }
  if (f.state == kStrEscape) {
    static constexpr std::string_view kEscapes = "\"\\/bfnrt";
    if (c == 'u') {
      f.state = kStrHex0;
      f.hex = 0;
      return StringScan::kContinue;
    }
    if (f.want_low_surrogate || kEscapes.find(static_cast<char>(c)) == std::string_view::npos) {
      return StringScan::kBad;
    }
    f.state = kStrPlain;
    return StringScan::kContinue;
  }
  if (f.state >= kStrHex0) {
    if (!IsHex(c)) return StringScan::kBad;
    const int digit = f.state - kStrHex0;
    const int v = IsDigit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
    // Surrogates decided by the first two digits, so that no prefix is a dead end: a low one
    // (DC00-DFFF) only right after a high one (D800-DBFF), which must be followed by a low one.
    if (digit == 0 && f.want_low_surrogate && v != 0xD) return StringScan::kBad;
    if (digit == 1 && f.hex == 0xD && (f.want_low_surrogate ? v < 0xC : v >= 0xC)) {
      return StringScan::kBad;
    }
    f.hex = static_cast<uint16_t>(f.hex * 16 + v);
    if (digit < 3) {
      ++f.state;
    } else {
      f.want_low_surrogate = !f.want_low_surrogate && f.hex >= 0xD800 && f.hex <= 0xDBFF;
      f.state = kStrPlain;
    }
    return StringScan::kContinue;
  }
  if (f.want_low_surrogate) {
    if (c != '\\') return StringScan::kBad;
    f.state = kStrEscape;
    return StringScan::kContinue;  // the pair is one character
  }
  if (c == '"') return StringScan::kEnd;
  if (c < 0x20) return StringScan::kBad;
  if (c == '\\') {
    f.state = kStrEscape;
  } else if (c >= 0x80) {
    f.utf8_lo = 0x80;
    f.utf8_hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      f.utf8_left = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      f.utf8_left = 2;
      if (c == 0xE0) f.utf8_lo = 0xA0;  // no overlong forms
      if (c == 0xED) f.utf8_hi = 0x9F;  // no surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      f.utf8_left = 3;
      if (c == 0xF0) f.utf8_lo = 0x90;  // no overlong forms
      if (c == 0xF4) f.utf8_hi = 0x8F;  // nothing above U+10FFFF
    } else {
      return StringScan::kBad;
    }
  }
  return StringScan::kCharStart;
}

bool JsonMatcher::StringByte(Frame& f, unsigned char c) {
  if (f.is_key) {
    Frame& object = stack_[stack_.size() - 2];
    // Escapes only in keys that name no declared property (they are compared as written).
    const bool escape =
        f.state != kStrPlain || f.want_low_surrogate || (c == '\\' && f.utf8_left == 0);
    if (escape && !node(object.node).additional_allowed) return false;
    const StringScan scan = ScanStringByte(f, c);
    if (scan == StringScan::kBad) return false;
    if (scan == StringScan::kEnd) {
      if (!KeyAllowed(object, buf_, /*whole=*/true)) return false;
      const SchemaNode& n = node(object.node);
      object.key_prop = -1;
      for (size_t i = 0; i < n.properties.size(); ++i) {
        if (n.properties[i].name == buf_ && !(object.used & (uint64_t{1} << i))) {
          object.key_prop = static_cast<int>(i);
          object.used |= uint64_t{1} << i;
          break;
        }
      }
      object.state = kObjAfterKey;
      stack_.pop_back();
      return true;
    }
    if (buf_.size() >= static_cast<size_t>(kMaxKeyBytes)) return false;
    buf_.push_back(static_cast<char>(c));
    return escape || KeyAllowed(object, buf_, /*whole=*/false);
  }
  const SchemaNode& n = node(f.node);
  const StringScan scan = ScanStringByte(f, c);
  if (scan == StringScan::kBad) return false;
  if (scan == StringScan::kEnd) {
    if (f.count < n.min_length) return false;
    EndValue();
    return true;
  }
  if (scan == StringScan::kCharStart) {
    if (n.max_length >= 0 && f.count >= n.max_length) return false;
    ++f.count;
  }
  return true;
}

bool JsonMatcher::NumberByte(Frame& f, unsigned char c, bool* handled) {
  *handled = true;
  const bool integer = f.integer;
  const bool digit = IsDigit(c);
  uint8_t next = 255;  // 255: c does not extend the number
  switch (f.state) {
    case kNumStart:
      if (c == '-')
        next = kNumMinus;
      else if (c == '0')
        next = kNumZero;
      else if (digit)
        next = kNumInt;
      break;
    case kNumMinus:
      if (c == '0')
        next = kNumZero;
      else if (digit)
        next = kNumInt;
      break;
    case kNumZero:
      if (digit) return false;  // no leading zeros
      if (c == '.' && !integer)
        next = kNumDot;
      else if ((c == 'e' || c == 'E') && !integer)
        next = kNumE;
      break;
    case kNumInt:
      if (digit)
        next = kNumInt;
      else if (c == '.' && !integer)
        next = kNumDot;
      else if ((c == 'e' || c == 'E') && !integer)
        next = kNumE;
      break;
    case kNumDot:
      if (digit) next = kNumFrac;
      break;
    case kNumFrac:
      if (digit)
        next = kNumFrac;
      else if (c == 'e' || c == 'E')
        next = kNumE;
      break;
    case kNumE:
      if (c == '+' || c == '-') {
        next = kNumESign;
      } else if (digit) {
        next = kNumExp;
        f.exp_digits = 1;
      }
      break;
    case kNumESign:
    case kNumExp:
      if (digit) {
        // A double's exponent: parsers refuse (or make infinite) what overflows it.
        f.exp_digits = f.state == kNumESign ? 1 : f.exp_digits + 1;
        if (f.exp_digits > kMaxExponentDigits) return false;
        next = kNumExp;
      }
      break;
  }
  if (next != 255) {
    if (++f.count > kMaxNumberChars) return false;
    f.state = next;
    return true;
  }
  const bool can_end =
      f.state == kNumZero || f.state == kNumInt || f.state == kNumFrac || f.state == kNumExp;
  if (!can_end) return false;
  *handled = false;  // the byte belongs to the enclosing frame
  EndValue();
  return true;
}

const std::vector<std::string>& JsonMatcher::LiteralTexts(const Frame& f) const {
  if (f.literal_enum) return node(f.node).enum_texts;
  static const std::vector<std::string> kNone, kBoolean_ = {"true", "false"}, kNull_ = {"null"},
                                               kBoth = {"true", "false", "null"};
  const uint8_t kinds = node(f.node).kinds;
  const bool b = kinds & kBoolean, n = kinds & kNull;
  return b && n ? kBoth : b ? kBoolean_ : n ? kNull_ : kNone;
}

bool JsonMatcher::LiteralByte(Frame& f, unsigned char c, bool* handled) {
  *handled = true;
  const std::vector<std::string>& texts = LiteralTexts(f);
  std::string next = buf_;
  next.push_back(static_cast<char>(c));
  bool extends = false, whole = false, longer = false;
  for (const std::string& t : texts) {
    if (t.compare(0, next.size(), next) != 0 || t.size() < next.size()) continue;
    extends = true;
    if (t.size() == next.size()) {
      whole = true;
    } else {
      longer = true;
    }
  }
  if (extends) {
    buf_ = std::move(next);
    if (whole && !longer) EndValue();  // nothing longer could follow: done
    return true;
  }
  for (const std::string& t : texts) {
    if (t == buf_) {  // complete as it is; c is the enclosing frame's
      *handled = false;
      EndValue();
      return true;
    }
  }
  return false;
}

}  // namespace tandem::structured
