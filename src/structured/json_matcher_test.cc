#include "structured/json_matcher.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

namespace tandem::structured {
namespace {

std::shared_ptr<const Schema> Compile(const std::string& text) {
  auto s = CompileSchema(text);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : nullptr;
}

// Whether the whole text is accepted and complete.
bool Accepts(const std::shared_ptr<const Schema>& schema, const std::string& text) {
  JsonMatcher m(schema);
  return m.FeedAll(text) && m.Complete();
}

// The length of the longest accepted prefix of `text`.
size_t AcceptedPrefix(const std::shared_ptr<const Schema>& schema, const std::string& text) {
  JsonMatcher m(schema);
  for (size_t i = 0; i < text.size(); ++i) {
    if (!m.Feed(static_cast<unsigned char>(text[i]))) return i;
  }
  return text.size();
}

const char* kPerson = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 8},
    "age": {"type": "integer"},
    "height": {"type": "number"},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
    "role": {"enum": ["admin", "user", 3]},
    "spouse": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "alive": {"type": "boolean"}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

TEST(JsonMatcherTest, AcceptsValidDocumentsOfTheSchema) {
  const auto s = Compile(kPerson);
  for (const std::string doc : {
           R"({"name":"Ann","age":31})",
           R"({ "age" : -4 , "name" : "Bo" })",
           R"({"name":"Ann","age":0,"height":1.75e2,"tags":["a","b"],"role":"user"})",
           R"({"name":"\u00e9\n","age":1,"role":3,"spouse":null,"alive":false})",
           R"({"spouse":"Cy","name":"naïve","age":7})",
       }) {
    EXPECT_TRUE(Accepts(s, doc)) << doc;
  }
}

// Found by fuzz/fuzz_json_schema.cc: strings are what strict JSON parsers accept (RFC 3629
// UTF-8 in keys and values, \u surrogates in pairs), so that the output always parses.
TEST(JsonMatcherTest, StringsAreWellFormedUtf8AndPairedSurrogates) {
  const auto any = AnyObjectSchema();
  for (const std::string doc : {
           "{\"k\xc3\xa9\":\"\xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf\"}",
           R"({"a":"\ud83d\ude00","\uD83D\uDE00":"\u00e9\ud7ff\ue000"})",
       }) {
    EXPECT_TRUE(Accepts(any, doc)) << doc;
    EXPECT_FALSE(nlohmann::json::parse(doc, nullptr, false).is_discarded()) << doc;
  }
  // Each refused at its bad byte (the prefix before it is accepted).
  for (const auto& [doc, at] : std::vector<std::pair<std::string, size_t>>{
           {"{\"\xde\":1}", 3},                  // a lead byte without its continuation, in a key
           {"{\"a\":\"\xc0\xaf\"}", 6},          // C0: an overlong lead byte
           {"{\"a\":\"\xe0\x80\x80\"}", 7},      // E0 80: overlong
           {"{\"a\":\"\xed\xa0\x80\"}", 7},      // ED A0: a UTF-8 surrogate
           {"{\"a\":\"\xf4\x90\x80\x80\"}", 7},  // above U+10FFFF
           {"{\"a\":\"\\udc00\"}", 9},           // a low surrogate alone
           {"{\"a\":\"\\ud800x\"}", 12},         // a high surrogate not followed by a low one
           {"{\"a\":\"\\ud800\\u0041\"}", 14},
           {"{\"a\":1e-300}", 10},  // an exponent of three digits (1e300 overflows a float parse)
       }) {
    EXPECT_EQ(AcceptedPrefix(any, doc), at) << doc;
  }
}

TEST(JsonMatcherTest, RefusesAtTheFirstByteThatBreaksTheSchema) {
  const auto s = Compile(kPerson);
  struct Case {
    std::string text;
    size_t bad_at;
  };
  const std::vector<Case> cases = {
      {R"({"nick":1})", 3},                     // no property starts with "ni"
      {R"({"name":"Ann","name":"B"})", 15},     // a property twice: no unused name starts "n"
      {R"({"name":"Ann"})", 13},                // '}' before the required "age"
      {R"({"age":1.5})", 8},                    // integer
      {R"({"age":01})", 8},                     // leading zero
      {R"({"name":"","age":1})", 9},            // minLength 1
      {R"({"name":"abcdefghi","age":1})", 17},  // maxLength 8
      {R"({"tags":["a","b","c"]})", 16},        // maxItems 2
      {R"({"role":"root"})", 9},                // enum
      {R"({"spouse":7})", 10},                  // anyOf string | null
      {R"({"alive":tru})", 12},                 // literal
      {"[1]", 0},                               // not an object
      {"{\"name\":\"a\x01\"}", 10},             // control character in a string
      {"{\"name\":\"\xff\"}", 9},               // not UTF-8
  };
  for (const Case& c : cases) {
    EXPECT_EQ(AcceptedPrefix(s, c.text), c.bad_at) << c.text;
  }
  // Incomplete documents are prefixes, not complete.
  JsonMatcher m(s);
  ASSERT_TRUE(m.FeedAll(R"({"name":"Ann","age":3)"));
  EXPECT_FALSE(m.Complete());
  ASSERT_TRUE(m.Feed('}'));
  EXPECT_TRUE(m.Complete());
  EXPECT_TRUE(m.Closed());
  EXPECT_TRUE(m.Feed(' '));
  EXPECT_FALSE(m.Feed('x'));  // nothing after the document
}

TEST(JsonMatcherTest, TopLevelNumbersAndLiteralsEndWhereTheTextDoes) {
  const auto num = Compile(R"({"type":"number"})");
  JsonMatcher m(num);
  ASSERT_TRUE(m.FeedAll("-12.5"));
  EXPECT_TRUE(m.Complete());
  EXPECT_FALSE(m.Closed());  // more digits may follow
  ASSERT_TRUE(m.FeedAll("e3 "));
  EXPECT_TRUE(m.Closed());
  EXPECT_FALSE(Accepts(num, "1."));
  EXPECT_FALSE(Accepts(num, "-"));
  const auto en = Compile(R"({"enum":[1, 12, "x"]})");
  EXPECT_TRUE(Accepts(en, "1"));
  EXPECT_TRUE(Accepts(en, "12"));
  EXPECT_TRUE(Accepts(en, "\"x\""));
  EXPECT_FALSE(Accepts(en, "13"));
}

TEST(JsonMatcherTest, WhitespaceRunsAreBounded) {
  const auto any = AnyObjectSchema();
  EXPECT_TRUE(Accepts(any, "{\n  \"a\": [1, 2]\n}"));
  EXPECT_EQ(AcceptedPrefix(any, "{" + std::string(40, ' ') + "}"), 1u + kMaxWhitespaceRun);
  EXPECT_EQ(AcceptedPrefix(any, "{\n\n}"), 2u);  // one line break per run
}

TEST(JsonMatcherTest, RecursiveRefsAndAdditionalPropertySchemas) {
  const auto tree = Compile(R"({
    "$defs": {"node": {"type": "object",
                       "properties": {"v": {"type": "integer"},
                                      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                       "required": ["v"], "additionalProperties": false}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(Accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4}]}]})"));
  EXPECT_FALSE(Accepts(tree, R"({"v":1,"kids":[{"w":2}]})"));
  const auto map = Compile(R"({"type":"object","additionalProperties":{"type":"boolean"}})");
  EXPECT_TRUE(Accepts(map, R"({"x":true,"y":false})"));
  EXPECT_FALSE(Accepts(map, R"({"x":1})"));
}

TEST(JsonMatcherTest, UnsupportedKeywordsAreRefusedByName) {
  for (const std::string bad :
       {R"({"type":"string","pattern":"^a"})", R"({"minimum":3})",
        R"({"anyOf":[{"type":"integer"},{"type":"number"}]})", R"({"$ref":"#/$defs/missing"})",
        R"({"type":"stringy"})", "not json"}) {
    auto s = CompileSchema(bad);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  }
  EXPECT_NE(CompileSchema(R"({"pattern":"x"})").status().message().find("pattern"),
            std::string::npos);
}

// Soundness against a real parser: whatever the matcher accepts as complete under the "any
// object" schema parses as a JSON object, and every document the parser accepts (that our
// whitespace and number limits allow) is accepted. Random mutations of valid documents.
TEST(JsonMatcherTest, AgreesWithNlohmannOnMutatedDocuments) {
  const auto any = AnyObjectSchema();
  const std::vector<std::string> seeds = {
      R"({"a":[1,2.5,-3e4,true,false,null,{"b":"c\"d"}],"e":{}})",
      R"({"k":"\u20ac\n","l":[[],[{}]],"m":0.0})",
  };
  std::mt19937 rng(7);
  const std::string alphabet = "{}[],:\"\\ 0123456789.-+eEtrufalsn";
  int checked = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string doc = seeds[iter % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % doc.size();
      switch (rng() % 3) {
        case 0: doc[pos] = alphabet[rng() % alphabet.size()]; break;
        case 1: doc.erase(pos, 1); break;
        default: doc.insert(pos, 1, alphabet[rng() % alphabet.size()]); break;
      }
    }
    const nlohmann::json parsed = nlohmann::json::parse(doc, nullptr, false);
    const bool valid = !parsed.is_discarded() && parsed.is_object();
    const bool accepted = Accepts(any, doc);
    if (accepted) {
      ASSERT_TRUE(valid) << doc;
    }
    if (valid && doc.find("  ") == std::string::npos) {
      // Our limits: numbers of at most kMaxNumberChars characters.
      ASSERT_TRUE(accepted) << doc;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 20000);
}

}  // namespace
}  // namespace tandem::structured
