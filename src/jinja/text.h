// Python's str operations that chat templates use, over UTF-8 strings: case mapping,
// replace, split and strip, with Python's semantics (internal to the renderer).
#pragma once

#include <cstdint>
#include <string>

#include "jinja/value.h"

namespace tandem::jinja {

// Case mapping of the scripts chat templates meet (ASCII, Latin-1, Latin Extended-A, Greek and
// Cyrillic; other code points are left as they are).
std::string Lower(const std::string& s);
std::string Upper(const std::string& s);
std::string Capitalize(const std::string& s);
std::string Title(const std::string& s);

// str.replace(from, to, count); count < 0: every occurrence.
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);

// str.split(sep, maxsplit): sep null or None splits on runs of whitespace.
List Split(const std::string& s, const Value* sep, int64_t maxsplit);

// Python's str.strip family: chars empty means whitespace.
std::string Strip(const std::string& s, const std::string& chars, bool left, bool right);

}  // namespace tandem::jinja
