#include "jinja/lexer.h"

#include <cctype>

#include "jinja/value.h"

namespace tandem::jinja {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class Lexer {
 public:
  Lexer(std::string_view src, const LexOptions& options) : src_(src), options_(options) {
    if (!options_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') {
      src_.remove_suffix(1);
    }
  }

  StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) {
      size_t open = src_.find('{', pos_);
      while (open != std::string_view::npos && open + 1 < src_.size() && src_[open + 1] != '{' &&
             src_[open + 1] != '%' && src_[open + 1] != '#') {
        open = src_.find('{', open + 1);
      }
      if (open == std::string_view::npos || open + 1 >= src_.size()) {
        EmitText(src_.size(), false);
        break;
      }
      const char type = src_[open + 1];
      const char mod = open + 2 < src_.size() ? src_[open + 2] : '\0';
      const bool strip_before = mod == '-';
      const bool lstrip = options_.lstrip_blocks && type != '{' && mod != '+';
      EmitText(open, strip_before ? false : lstrip, strip_before);
      pos_ = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (type == '#') {
        const size_t close = src_.find("#}", pos_);
        if (close == std::string_view::npos) return Error("unclosed comment");
        CountLines(pos_, close + 2);
        const bool strip_after = close > pos_ && src_[close - 1] == '-';
        pos_ = close + 2;
        AfterTag(strip_after, close > 0 && src_[close - 1] == '+', true);
        continue;
      }
      const bool block = type == '%';
      const size_t first = tokens_.size();
      tokens_.push_back({block ? Token::Kind::kBlockBegin : Token::Kind::kVarBegin, "", line_});
      char end_mod = '\0';
      TANDEM_RETURN_IF_ERROR(LexExpression(block, &end_mod));
      tokens_.push_back({block ? Token::Kind::kBlockEnd : Token::Kind::kVarEnd, "", line_});
      AfterTag(end_mod == '-', end_mod == '+', block);
      if (block && tokens_.size() == first + 3 && tokens_[first + 1].kind == Token::Kind::kName &&
          tokens_[first + 1].text == "raw") {
        tokens_.resize(first);
        TANDEM_RETURN_IF_ERROR(RawBlock());
      }
    }
    return std::move(tokens_);
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("template syntax error at line " + std::to_string(line_) + ": " + what);
  }

  void CountLines(size_t from, size_t to) {
    for (size_t i = from; i < to && i < src_.size(); ++i) line_ += src_[i] == '\n';
  }

  // Emits the text from pos_ to `end`. lstrip: remove spaces and tabs before `end` that start
  // a line (lstrip_blocks); strip_all: remove every trailing whitespace ({%- and friends).
  void EmitText(size_t end, bool lstrip, bool strip_all = false) {
    size_t stop = end;
    if (strip_all) {
      while (stop > pos_ && IsSpace(src_[stop - 1])) --stop;
    } else if (lstrip) {
      size_t i = end;
      while (i > pos_ && (src_[i - 1] == ' ' || src_[i - 1] == '\t')) --i;
      // Only spaces that start a line go; after a tag on the same line they stay.
      if (i == 0 || src_[i - 1] == '\n') stop = i;
    }
    size_t begin = pos_;
    if (strip_next_) {
      while (begin < stop && IsSpace(src_[begin])) ++begin;
      strip_next_ = false;
    }
    if (stop > begin)
      tokens_.push_back({Token::Kind::kText, std::string(src_.substr(begin, stop - begin)), line_});
    CountLines(pos_, end);
    pos_ = end;
  }

  // After a tag's end: "-" strips the whitespace that follows; trim_blocks drops one newline
  // after a block or comment tag unless it ends with "+".
  void AfterTag(bool strip_after, bool keep, bool block_or_comment) {
    if (strip_after) {
      strip_next_ = true;
    } else if (block_or_comment && options_.trim_blocks && !keep && pos_ < src_.size()) {
      if (src_[pos_] == '\n') {
        ++pos_;
        ++line_;
      } else if (src_.compare(pos_, 2, "\r\n") == 0) {
        pos_ += 2;
        ++line_;
      }
    }
  }

  // {% raw %}...{% endraw %}: the text between, verbatim.
  Status RawBlock() {
    size_t search = pos_;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string_view::npos) return Error("unclosed raw block");
      size_t i = open + 2;
      const bool strip_before = i < src_.size() && src_[i] == '-';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && IsSpace(src_[i])) ++i;
      char mod = '\0';
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) mod = src_[i++];
      if (src_.compare(i, 2, "%}") != 0) return Error("malformed endraw");
      EmitText(open, options_.lstrip_blocks, strip_before);
      CountLines(pos_, i + 2);
      pos_ = i + 2;
      AfterTag(mod == '-', mod == '+', true);
      return OkStatus();
    }
  }

  Status LexExpression(bool block, char* end_mod) {
    int depth = 0;  // open brackets: "}}" inside a dict literal is not the tag's end
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) return Error(block ? "unclosed '{%'" : "unclosed '{{'");
      const std::string_view rest = src_.substr(pos_);
      const std::string_view close = block ? "%}" : "}}";
      if (depth == 0) {
        for (char m : {'-', '+'}) {
          if (rest.size() >= 3 && rest[0] == m && rest.substr(1, 2) == close) {
            *end_mod = m;
            pos_ += 3;
            return OkStatus();
          }
        }
        if (rest.substr(0, 2) == close) {
          pos_ += 2;
          return OkStatus();
        }
      }
      const char c = rest[0];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t n = 1;
        while (n < rest.size() &&
               (std::isalnum(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
          ++n;
        tokens_.push_back({Token::Kind::kName, std::string(rest.substr(0, n)), line_});
        pos_ += n;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        TANDEM_RETURN_IF_ERROR(LexNumber(rest));
      } else if (c == '\'' || c == '"') {
        TANDEM_RETURN_IF_ERROR(LexString(rest));
      } else {
        static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : kTwo) {
          if (rest.substr(0, 2) == t) op = t;
        }
        if (op.size() == 1 &&
            std::string_view("()[]{},.:|+-*/%~<>=").find(c) == std::string_view::npos) {
          return Error(std::string("unexpected character '") + c + "'");
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        tokens_.push_back({Token::Kind::kOp, op, line_});
        pos_ += op.size();
      }
    }
  }

  Status LexNumber(std::string_view rest) {
    size_t n = 0;
    bool is_float = false;
    while (n < rest.size() && (std::isdigit(static_cast<unsigned char>(rest[n])) || rest[n] == '_'))
      ++n;
    if (n + 1 < rest.size() && rest[n] == '.' &&
        std::isdigit(static_cast<unsigned char>(rest[n + 1]))) {
      is_float = true;
      ++n;
      while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && std::isdigit(static_cast<unsigned char>(rest[m]))) {
        is_float = true;
        n = m;
        while (n < rest.size() && std::isdigit(static_cast<unsigned char>(rest[n]))) ++n;
      }
    }
    std::string text;
    for (char ch : rest.substr(0, n)) {
      if (ch != '_') text.push_back(ch);
    }
    tokens_.push_back({is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, line_});
    pos_ += n;
    return OkStatus();
  }

  // Python's string-literal escapes (jinja2 decodes literals with "unicode-escape").
  Status LexString(std::string_view rest) {
    const char quote = rest[0];
    std::string value;
    size_t i = 1;
    const int start_line = line_;
    for (; i < rest.size() && rest[i] != quote; ++i) {
      if (rest[i] == '\n') ++line_;
      if (rest[i] != '\\' || i + 1 >= rest.size()) {
        value.push_back(rest[i]);
        continue;
      }
      const char e = rest[++i];
      const auto hex = [&](size_t digits) -> StatusOr<uint32_t> {
        if (i + digits >= rest.size()) return Error("truncated escape in a string");
        uint32_t cp = 0;
        for (size_t k = 1; k <= digits; ++k) {
          const char h = rest[i + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) return Error("bad escape in a string");
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                   ? h - '0'
                                                   : (std::tolower(h) - 'a' + 10));
        }
        i += digits;
        return cp;
      };
      switch (e) {
        case 'n': value.push_back('\n'); break;
        case 't': value.push_back('\t'); break;
        case 'r': value.push_back('\r'); break;
        case 'b': value.push_back('\b'); break;
        case 'f': value.push_back('\f'); break;
        case 'v': value.push_back('\v'); break;
        case 'a': value.push_back('\a'); break;
        case '0': value.push_back('\0'); break;
        case '\\': value.push_back('\\'); break;
        case '\'': value.push_back('\''); break;
        case '"': value.push_back('"'); break;
        case '\n': ++line_; break;  // a backslash before a newline joins the lines
        case 'x':
        case 'u':
        case 'U': {
          TANDEM_ASSIGN_OR_RETURN(const uint32_t cp, hex(e == 'x' ? 2 : e == 'u' ? 4 : 8));
          if (cp > 0x10FFFF) return Error("escape beyond Unicode in a string");
          AppendUtf8(cp, &value);
          break;
        }
        default:  // unknown escapes stay as written
          value.push_back('\\');
          value.push_back(e);
      }
    }
    if (i >= rest.size()) {
      line_ = start_line;
      return Error("unclosed string literal");
    }
    tokens_.push_back({Token::Kind::kString, std::move(value), start_line});
    pos_ += i + 1;
    return OkStatus();
  }

  std::string_view src_;
  LexOptions options_;
  size_t pos_ = 0;
  int line_ = 1;
  bool strip_next_ = false;
  std::vector<Token> tokens_;
};

}  // namespace

StatusOr<std::vector<Token>> Lex(std::string_view source, const LexOptions& options) {
  return Lexer(source, options).Run();
}

}  // namespace tandem::jinja
