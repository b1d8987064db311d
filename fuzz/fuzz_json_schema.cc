// Structured output (src/structured): the schema compiler on arbitrary schemas (they come
// from requests' response_format and tools), and the JSON matcher on arbitrary documents.
// Input: the schema text, a NUL, then a document (no NUL: the document is matched against
// the json_object schema, any object).
// Properties: no crash or sanitizer report; trying a byte on a copy (WouldAccept) agrees with
// feeding it; a document the matcher takes whole (every byte accepted, Complete) is JSON that
// nlohmann::json parses, of the kind the schema's first byte allowed.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "structured/json_matcher.h"
#include "structured/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::structured;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::shared_ptr<const Schema> schema;
  std::string_view doc = in;
  if (nul != std::string_view::npos) {
    auto compiled = CompileSchema(in.substr(0, nul));
    if (!compiled.ok()) {
      TANDEM_FUZZ_CHECK(!compiled.status().message().empty());
      return 0;
    }
    schema = *compiled;
    doc = in.substr(nul + 1);
  } else {
    schema = AnyObjectSchema();
  }
  JsonMatcher matcher(schema), scratch(schema);
  size_t taken = 0;
  for (; taken < doc.size(); ++taken) {
    const bool would = matcher.WouldAccept(doc.substr(taken, 1), &scratch);
    const bool fed = matcher.Feed(static_cast<unsigned char>(doc[taken]));
    TANDEM_FUZZ_CHECK(would == fed);
    if (!fed) break;
  }
  if (taken == doc.size() && matcher.Complete()) {
    const auto parsed = nlohmann::json::parse(doc, nullptr, /*allow_exceptions=*/false);
    TANDEM_FUZZ_CHECK(!parsed.is_discarded());
    if (nul == std::string_view::npos) TANDEM_FUZZ_CHECK(parsed.is_object());
  }
  return 0;
}
