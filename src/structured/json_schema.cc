#include "structured/json_schema.h"

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace tandem::structured {
namespace {

using nlohmann::json;

uint8_t KindOfValue(const json& v) {
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  if (v.is_boolean()) return kBoolean;
  if (v.is_null()) return kNull;
  return v.is_number_integer() ? kInteger : kNumber;
}

// Numbers and integers both begin with a digit or '-': a value's first character tells the
// kinds apart except those two.
uint8_t FirstCharClass(uint8_t kinds) {
  return static_cast<uint8_t>((kinds & ~kInteger) | ((kinds & kInteger) ? kNumber : 0));
}

class Compiler {
 public:
  explicit Compiler(const json& root) : root_(root) {
    schema_.nodes.emplace_back();  // node 0: any value
  }

  StatusOr<int> Compile(const json& s, const std::string& path) {
    if (++depth_ > 64) return InvalidArgument("the schema nests deeper than 64 levels at " + path);
    struct DepthGuard {
      int* d;
      ~DepthGuard() { --*d; }
    } guard{&depth_};
    if (s.is_boolean()) {
      if (s.get<bool>()) return 0;
      return InvalidArgument("the schema 'false' (no value allowed) at " + path +
                             " is not supported");
    }
    if (!s.is_object()) return InvalidArgument("a schema must be an object at " + path);
    static const std::set<std::string> kIgnored = {
        "title",    "description", "default",  "examples",  "format", "$schema",     "$id",
        "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",  "definitions", "strict"};
    static const std::set<std::string> kKnown = {"type",
                                                 "properties",
                                                 "required",
                                                 "additionalProperties",
                                                 "items",
                                                 "minItems",
                                                 "maxItems",
                                                 "minLength",
                                                 "maxLength",
                                                 "enum",
                                                 "const",
                                                 "anyOf",
                                                 "oneOf",
                                                 "allOf",
                                                 "$ref",
                                                 "nullable",
                                                 "x-tandem-ordered",
                                                 "x-tandem-variants"};
    for (const auto& [key, value] : s.items()) {
      if (!kIgnored.count(key) && !kKnown.count(key)) {
        return InvalidArgument("the JSON Schema keyword '" + key + "' (at " + path +
                               ") is not supported for constrained decoding");
      }
    }
    if (auto it = s.find("$ref"); it != s.end()) {
      if (s.size() > 1 && !OnlyAnnotations(s, {"$ref"})) {
        return InvalidArgument("'$ref' beside other keywords (at " + path + ") is not supported");
      }
      return Ref(*it, path);
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->size() != 1 || s.size() > 1) {
        return InvalidArgument("'allOf' (at " + path + ") is supported with one schema only");
      }
      return Compile((*it)[0], path + "/allOf/0");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto it = s.find(key); it != s.end()) return Union(s, *it, path + "/" + key);
    }
    const int index = NewNode();
    SchemaNode node;
    TANDEM_RETURN_IF_ERROR(Fill(s, path, &node));
    schema_.nodes[index] = std::move(node);
    return index;
  }

  Schema Take(int root) {
    schema_.root = root;
    return std::move(schema_);
  }

 private:
  int NewNode() {
    schema_.nodes.emplace_back();
    return static_cast<int>(schema_.nodes.size()) - 1;
  }

  static bool OnlyAnnotations(const json& s, std::set<std::string> allowed) {
    allowed.insert({"title", "description", "default", "examples", "$comment", "deprecated",
                    "$defs", "definitions", "$schema", "$id"});
    for (const auto& [key, value] : s.items()) {
      if (!allowed.count(key)) return false;
    }
    return true;
  }

  StatusOr<int> Ref(const json& ref, const std::string& path) {
    if (!ref.is_string()) return InvalidArgument("'$ref' must be a string at " + path);
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    std::string section, name;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      if (r.rfind(prefix, 0) == 0) {
        section = std::string(prefix).substr(2, std::string(prefix).size() - 3);
        name = r.substr(std::string(prefix).size());
      }
    }
    if (section.empty() || !root_.contains(section) || !root_[section].contains(name)) {
      return InvalidArgument("'$ref' '" + r + "' (at " + path +
                             ") does not name a schema under #/$defs or #/definitions");
    }
    // A placeholder first, so that a recursive reference finds it.
    const json& target = root_[section][name];
    if (target.is_object() && (target.contains("anyOf") || target.contains("oneOf") ||
                               target.contains("$ref") || target.contains("allOf"))) {
      TANDEM_ASSIGN_OR_RETURN(int node, Compile(target, r));
      refs_[r] = node;
      return node;
    }
    const int index = NewNode();
    refs_[r] = index;
    SchemaNode node;
    if (!target.is_object()) return InvalidArgument("'" + r + "' must be a schema object");
    ++depth_;
    Status st = Fill(target, r, &node);
    --depth_;
    TANDEM_RETURN_IF_ERROR(st);
    schema_.nodes[index] = std::move(node);
    return index;
  }

  StatusOr<int> Union(const json& s, const json& branches, const std::string& path) {
    if (!branches.is_array() || branches.empty()) {
      return InvalidArgument("'" + path + "' must be a non-empty array of schemas");
    }
    const int index = NewNode();
    SchemaNode node;
    node.kinds = 0;
    uint8_t seen = 0;
    for (size_t i = 0; i < branches.size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(int b, Compile(branches[i], path + "/" + std::to_string(i)));
      const SchemaNode& branch = schema_.nodes[b];
      uint8_t kinds = branch.kinds;
      if (!branch.enum_texts.empty()) {
        return InvalidArgument("an enum inside '" + path +
                               "' is not supported; list the values in one enum");
      }
      if (FirstCharClass(kinds) & seen) {
        return InvalidArgument("the branches of '" + path +
                               "' overlap in kind (they must begin differently: object, array, "
                               "string, number, boolean, null)");
      }
      seen |= FirstCharClass(kinds);
      node.kinds |= kinds;
      for (int k = 0; k < 7; ++k) {
        if (kinds & (1u << k)) node.kind_node[k] = b;
      }
    }
    if (!OnlyAnnotations(s, {"anyOf", "oneOf"})) {
      return InvalidArgument("'" + path + "' beside other keywords is not supported");
    }
    schema_.nodes[index] = std::move(node);
    return index;
  }

  Status Fill(const json& s, const std::string& path, SchemaNode* node) {
    auto int_field = [&](const char* key, int* out) -> Status {
      auto it = s.find(key);
      if (it == s.end()) return OkStatus();
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > (1 << 24)) {
        return InvalidArgument("'" + std::string(key) +
                               "' must be a small non-negative integer at " + path);
      }
      *out = static_cast<int>(it->get<int64_t>());
      return OkStatus();
    };
    bool typed = false;
    if (auto it = s.find("type"); it != s.end()) {
      typed = true;
      node->kinds = 0;
      std::vector<json> types =
          it->is_array() ? it->get<std::vector<json>>() : std::vector<json>{*it};
      for (const json& t : types) {
        static const std::map<std::string, uint8_t> kTypes = {
            {"object", kObject},   {"array", kArray},     {"string", kString}, {"number", kNumber},
            {"integer", kInteger}, {"boolean", kBoolean}, {"null", kNull}};
        if (!t.is_string() || !kTypes.count(t.get<std::string>())) {
          return InvalidArgument("unknown 'type' " + t.dump() + " at " + path);
        }
        node->kinds |= kTypes.at(t.get<std::string>());
      }
      if ((node->kinds & kNumber) && (node->kinds & kInteger)) node->kinds &= ~kInteger;
    }
    if (s.value("nullable", false)) node->kinds |= kNull;
    for (const char* key : {"enum", "const"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      std::vector<json> values;
      if (std::string(key) == "const") {
        values.push_back(*it);
      } else if (!it->is_array() || it->empty()) {
        return InvalidArgument("'enum' must be a non-empty array at " + path);
      } else {
        values = it->get<std::vector<json>>();
      }
      uint8_t kinds = 0;
      for (const json& v : values) {
        node->enum_texts.push_back(v.dump());
        kinds |= KindOfValue(v);
      }
      node->kinds = kinds;
    }
    if (!typed && node->enum_texts.empty()) {
      // Untyped: what its keywords describe, else anything.
      if (s.contains("properties") || s.contains("required") ||
          s.contains("additionalProperties")) {
        node->kinds = kObject;
      } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
        node->kinds = kArray;
      } else if (s.contains("minLength") || s.contains("maxLength")) {
        node->kinds = kString;
      }
    }
    if (auto it = s.find("properties"); it != s.end()) {
      if (!it->is_object()) return InvalidArgument("'properties' must be an object at " + path);
      if (it->size() > static_cast<size_t>(kMaxObjectProperties)) {
        return InvalidArgument("at most 64 properties per object are supported (at " + path + ")");
      }
      // nlohmann keeps keys sorted, so declared order is lost: an ordered object lists its
      // properties in the order of its "required" array, then the others.
      std::vector<std::string> names;
      if (s.value("x-tandem-ordered", false) && s.contains("required") &&
          s["required"].is_array()) {
        for (const json& r : s["required"]) {
          if (r.is_string() && it->contains(r.get<std::string>())) {
            names.push_back(r.get<std::string>());
          }
        }
      }
      for (const auto& [name, sub] : it->items()) {
        if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
      }
      for (const std::string& name : names) {
        const json& sub = (*it)[name];
        for (unsigned char c : name) {
          if (c < 0x20 || c == '"' || c == '\\') {
            return InvalidArgument(
                "property names with quotes, backslashes or control "
                "characters are not supported ('" +
                name + "' at " + path + ")");
          }
        }
        TANDEM_ASSIGN_OR_RETURN(int sub_node, Compile(sub, path + "/properties/" + name));
        node->properties.push_back({name, sub_node, false});
      }
    }
    if (auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) return InvalidArgument("'required' must be an array at " + path);
      for (const json& r : *it) {
        if (!r.is_string()) return InvalidArgument("'required' must list names at " + path);
        bool found = false;
        for (auto& p : node->properties) {
          if (p.name == r.get<std::string>()) p.required = found = true;
        }
        if (!found) {
          return InvalidArgument("'required' names '" + r.get<std::string>() +
                                 "', which 'properties' does not define (at " + path + ")");
        }
      }
    }
    if (auto it = s.find("additionalProperties"); it != s.end()) {
      if (it->is_boolean()) {
        node->additional_allowed = it->get<bool>();
      } else {
        TANDEM_ASSIGN_OR_RETURN(node->additional_node,
                                Compile(*it, path + "/additionalProperties"));
      }
    }
    if (auto it = s.find("items"); it != s.end()) {
      TANDEM_ASSIGN_OR_RETURN(node->items_node, Compile(*it, path + "/items"));
    }
    node->ordered = s.value("x-tandem-ordered", false);
    if (auto it = s.find("x-tandem-variants"); it != s.end()) {
      TANDEM_RETURN_IF_ERROR(Variants(*it, path, node));
    }
    TANDEM_RETURN_IF_ERROR(int_field("minItems", &node->min_items));
    TANDEM_RETURN_IF_ERROR(int_field("maxItems", &node->max_items));
    TANDEM_RETURN_IF_ERROR(int_field("minLength", &node->min_length));
    TANDEM_RETURN_IF_ERROR(int_field("maxLength", &node->max_length));
    if (node->max_items >= 0 && node->max_items < node->min_items) {
      return InvalidArgument("'maxItems' is below 'minItems' at " + path);
    }
    if (node->max_length >= 0 && node->max_length < node->min_length) {
      return InvalidArgument("'maxLength' is below 'minLength' at " + path);
    }
    if (node->kinds == 0) return InvalidArgument("the schema at " + path + " allows no value");
    return OkStatus();
  }

  Status Variants(const json& v, const std::string& path, SchemaNode* node) {
    auto index_of = [&](const std::string& name) {
      for (size_t i = 0; i < node->properties.size(); ++i) {
        if (node->properties[i].name == name) return static_cast<int>(i);
      }
      return -1;
    };
    if (!v.is_object() || !v.contains("on") || !v.contains("property") || !v.contains("schemas") ||
        !v["on"].is_string() || !v["property"].is_string() || !v["schemas"].is_array()) {
      return InvalidArgument("'x-tandem-variants' needs 'on', 'property' and 'schemas' at " + path);
    }
    node->variant_on = index_of(v["on"].get<std::string>());
    node->variant_property = index_of(v["property"].get<std::string>());
    if (node->variant_on < 0 || node->variant_property <= node->variant_on || !node->ordered) {
      return InvalidArgument("'x-tandem-variants' at " + path +
                             " needs ordered properties, 'on' declared before 'property'");
    }
    const size_t n_values =
        schema_.nodes[node->properties[node->variant_on].node].enum_texts.size();
    if (n_values != v["schemas"].size()) {
      return InvalidArgument("'x-tandem-variants' at " + path + " needs one schema per enum value");
    }
    for (size_t i = 0; i < v["schemas"].size(); ++i) {
      TANDEM_ASSIGN_OR_RETURN(
          int n, Compile(v["schemas"][i], path + "/x-tandem-variants/" + std::to_string(i)));
      node->variant_nodes.push_back(n);
    }
    return OkStatus();
  }

  const json& root_;
  Schema schema_;
  std::map<std::string, int> refs_;
  int depth_ = 0;
};

}  // namespace

StatusOr<std::shared_ptr<const Schema>> CompileSchema(std::string_view text) {
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument("the JSON schema is not valid JSON");
  try {
    Compiler compiler(root);
    TANDEM_ASSIGN_OR_RETURN(int node, compiler.Compile(root, "#"));
    return std::make_shared<const Schema>(compiler.Take(node));
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("the JSON schema could not be read: ") + e.what());
  }
}

std::shared_ptr<const Schema> AnyObjectSchema() {
  static const std::shared_ptr<const Schema> schema = [] {
    Schema s;
    s.nodes.resize(2);
    s.nodes[1].kinds = kObject;
    s.root = 1;
    return std::make_shared<const Schema>(std::move(s));
  }();
  return schema;
}

}  // namespace tandem::structured
