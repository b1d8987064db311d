// A JSON Schema compiled for constrained decoding: the subset that response_format json_schema
// and tool parameters use in practice, as a table of nodes the matcher (json_matcher.h) walks.
//
// Supported: "type" (object, array, string, number, integer, boolean, null, or a list of them),
// "properties", "required", "additionalProperties" (false, true, or a schema), "items",
// "minItems"/"maxItems", "minLength"/"maxLength", "enum", "const", "anyOf"/"oneOf" whose
// branches begin with different JSON kinds (e.g. a type and null), local "$ref" to "#/$defs/..."
// or "#/definitions/...", and {} / true (any value). Annotations (title, description, default,
// examples, format, $schema, ...) are ignored. Anything else that restricts values (pattern,
// minimum, multipleOf, ...) is refused with InvalidArgument naming the keyword, rather than
// silently not enforced.
//
// Two keywords of our own serve tool calls (structured/tool_call.h), where the arguments'
// schema depends on the function's name: "x-tandem-ordered": true (properties appear in their
// declared order) and "x-tandem-variants": {"on": P, "property": Q, "schemas": [S0, S1, ...]}
// (P is an enum property declared before Q; when P's value is its i-th enum value, Q's value
// follows Si).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::structured {

// Properties per object schema at most (the matcher tracks them in a 64-bit mask).
inline constexpr int kMaxObjectProperties = 64;

// Bit set of JSON value kinds.
enum Kind : uint8_t {
  kObject = 1,
  kArray = 2,
  kString = 4,
  kNumber = 8,    // any JSON number
  kInteger = 16,  // digits only (no fraction or exponent)
  kBoolean = 32,
  kNull = 64,
  kAnyKind = 127,
};

struct SchemaNode {
  uint8_t kinds = kAnyKind;  // what a value may be (by its first character)
  // Objects.
  struct Property {
    std::string name;  // raw (unescaped) name; matched byte for byte against the key's text
    int node = 0;
    bool required = false;
  };
  std::vector<Property> properties;
  bool additional_allowed = true;  // keys outside `properties`
  int additional_node = 0;         // their values' schema (node 0 is "any")
  bool ordered = false;            // properties only in declared order
  int variant_on = -1;             // x-tandem-variants: the discriminating property's index
  int variant_property = -1;       // the property whose schema varies
  std::vector<int> variant_nodes;  // per enum value of variant_on
  // Arrays.
  int items_node = 0;
  int min_items = 0;
  int max_items = -1;  // -1: no limit
  // Strings (code points).
  int min_length = 0;
  int max_length = -1;
  // enum / const: the compact JSON text of each allowed value; empty: not an enum.
  std::vector<std::string> enum_texts;
  // anyOf / oneOf / a type list with per-kind schemas: the node for a value of each kind, chosen
  // by its first character (-1: this node itself).
  int kind_node[7] = {-1, -1, -1, -1, -1, -1, -1};
};

// Node 0 is "any JSON value"; the root is `root`.
struct Schema {
  std::vector<SchemaNode> nodes;
  int root = 0;
};

// Compiles schema text (a JSON document). InvalidArgument names what is wrong or unsupported.
StatusOr<std::shared_ptr<const Schema>> CompileSchema(std::string_view schema_json);

// The schema of response_format json_object: any JSON object.
std::shared_ptr<const Schema> AnyObjectSchema();

}  // namespace tandem::structured
