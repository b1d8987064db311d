// An incremental matcher of JSON text against a compiled schema (json_schema.h): fed one byte at
// a time, it says whether the text so far is still the prefix of some document the schema
// allows. The sampler asks it, for candidate tokens, whether their bytes keep the output valid.
//
// Beyond JSON and the schema it enforces: property order free but each
// property at most once and the required ones before '}', well-formed UTF-8 inside strings, at
// most kMaxWhitespaceRun whitespace bytes in a row outside strings, one line break among them (a
// small model must not pad forever; pretty-printing still fits), numbers of at most kMaxNumberChars
// characters and kMaxExponentDigits exponent digits, escapes only in keys of objects that allow
// undeclared properties (keys are compared with property names as written).
//
// Cheap to copy (a small stack and one buffer): a candidate is tried on a copy.
// Not thread-safe; one per sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "structured/json_schema.h"

namespace tandem::structured {

inline constexpr int kMaxWhitespaceRun = 12;  // bytes, of which one line break at most
inline constexpr int kMaxNumberChars = 24;
inline constexpr int kMaxExponentDigits = 2;  // |value| < 1e124: always a finite double
inline constexpr int kMaxKeyBytes = 256;

class JsonMatcher {
 public:
  explicit JsonMatcher(std::shared_ptr<const Schema> schema);

  // Consumes one byte; false when the text would stop being a valid prefix (the state is then
  // unspecified: try candidates on a copy).
  bool Feed(unsigned char c);
  // Feeds every byte; false at the first refused one.
  bool FeedAll(std::string_view bytes);
  // Whether FeedAll(bytes) would succeed, tried on `scratch` (a matcher of the same schema whose
  // state is overwritten; its buffers are reused, so a trial allocates nothing once warm).
  bool WouldAccept(std::string_view bytes, JsonMatcher* scratch) const;
  // Overwrites `other` (a matcher of the same schema) with this state, reusing its buffers.
  void CopyStateTo(JsonMatcher* other) const;

  // The text so far is a whole document (it may still go on, e.g. a top-level number).
  bool Complete() const;
  // The document is closed: nothing but whitespace may follow.
  bool Closed() const { return closed_; }
  // How many bytes of printable ASCII other than '"' and '\\' (0x20-0x7E) surely may follow:
  // inside a string value between characters, the characters its maxLength still allows
  // (SIZE_MAX without one); inside a key of an object that allows undeclared keys (declared in
  // any order), the bytes kMaxKeyBytes still allows; 0 anywhere else. The sampler lets such tokens
  // through without trying them.
  size_t PlainStringRoom() const;

 private:
  enum class Type : uint8_t { kValue, kObject, kArray, kString, kNumber, kLiteral };
  struct Frame {
    Type type = Type::kValue;
    uint8_t state = 0;
    bool is_key = false;        // kString: an object key (bytes go to buf_)
    bool literal_enum = false;  // kLiteral: the node's enum texts (else true/false/null)
    bool integer = false;       // kNumber: digits only (no fraction or exponent)
    int node = 0;
    int count = 0;  // array items, string code points, number characters
    // kString: UTF-8 continuation bytes still expected and the range the next one must be in
    // (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
    uint8_t utf8_left = 0, utf8_lo = 0x80, utf8_hi = 0xBF;
    bool want_low_surrogate = false;  // kString: a \uD800-DBFF escape awaits its \uDC00-DFFF
    uint16_t hex = 0;                 // kString: the \u escape's digits so far
    uint8_t exp_digits = 0;           // kNumber: exponent digits so far
    int key_prop = -1;                // kObject: the property being valued (-1: an additional one)
    uint64_t used = 0;                // kObject: properties seen (bit per property index)
    int variant = -1;                 // kObject: index of the discriminating property's value
  };

  bool Whitespace(unsigned char c);  // one whitespace byte outside strings: within the limits?
  bool StartValue(Frame& f, unsigned char c);  // f: a kValue frame, c: its first byte
  void EndValue();                             // the top frame's value is complete: pop it
  bool ObjectByte(Frame& f, unsigned char c);
  bool ArrayByte(Frame& f, unsigned char c);
  bool StringByte(Frame& f, unsigned char c);
  // What one byte inside a string (after its opening quote) is: refused, the closing quote,
  // the first byte of a character (counted against length limits) or a further byte of one.
  enum class StringScan { kBad, kEnd, kCharStart, kContinue };
  static StringScan ScanStringByte(Frame& f, unsigned char c);
  bool NumberByte(Frame& f, unsigned char c, bool* handled);
  bool LiteralByte(Frame& f, unsigned char c, bool* handled);
  bool KeyAllowed(const Frame& object, std::string_view key, bool whole) const;
  bool MoreKeysPossible(const Frame& object) const;
  bool RequiredDone(const Frame& object) const;
  const std::vector<std::string>& LiteralTexts(const Frame& f) const;
  const SchemaNode& node(int i) const { return schema_->nodes[static_cast<size_t>(i)]; }

  std::shared_ptr<const Schema> schema_;
  std::vector<Frame> stack_;
  std::string buf_;          // the key or literal being matched (only the innermost frame uses it)
  int ws_run_ = 0;           // whitespace bytes in a row (outside strings)
  bool ws_newline_ = false;  // the run holds a line break
  bool closed_ = false;
};

}  // namespace tandem::structured
