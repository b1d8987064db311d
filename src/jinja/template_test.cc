// Template tests: every golden case renders byte-identically to jinja2 (or fails where jinja2
// raised, with its message); tests/golden/jinja/README.md says how the cases were produced.
#include "jinja/template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tandem::jinja {
namespace {

nlohmann::ordered_json ReadGolden() {
  // $TANDEM_SOURCE_DIR (CTest sets it), else relative to this source file.
  const char* root = std::getenv("TANDEM_SOURCE_DIR");
  const std::string path = (root ? std::string(root) : std::string(__FILE__) + "/../../..") +
                           "/tests/golden/jinja/jinja_golden.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

TEST(JinjaGoldenTest, EveryCaseMatchesJinja2) {
  const nlohmann::ordered_json golden = ReadGolden();
  int rendered = 0, refused = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["template"].get<std::string>();
    auto t = Template::Parse(golden["templates"][name].get<std::string>());
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().ToString();
    auto out = t->Render(c["context"]);
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok()) << name << " rendered what jinja2 refused: " << c["context"].dump();
      EXPECT_NE(out.status().message().find(c["error"].get<std::string>()), std::string::npos)
          << out.status().message();
      ++refused;
    } else {
      ASSERT_TRUE(out.ok()) << name << ": " << out.status().ToString() << "\n"
                            << c["context"].dump();
      EXPECT_EQ(*out, c["expected"].get<std::string>()) << name << "\n" << c["context"].dump();
      ++rendered;
    }
  }
  EXPECT_EQ(rendered, 81);
  EXPECT_EQ(refused, 10);
}

std::string Render(const std::string& source, const nlohmann::ordered_json& context = {}) {
  auto t = Template::Parse(source);
  if (!t.ok()) return "parse error: " + t.status().message();
  auto out = t->Render(context.is_null() ? nlohmann::ordered_json::object() : context);
  return out.ok() ? *out : "render error: " + out.status().message();
}

TEST(JinjaTest, SyntaxErrorsNameTheirLine) {
  for (const char* bad : {"a\n{% if x %}never closed", "{{ 1 + }}", "{% for in x %}{% endfor %}",
                          "x\n\n{{ 'unclosed }}", "{% endif %}", "{% include 'x' %}",
                          "{{ a[1:2:3:4] }}", "{# open comment"}) {
    auto t = Template::Parse(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("line "), std::string::npos) << t.status().message();
  }
  EXPECT_NE(Render("a\n{% if x %}").find("line 2"), std::string::npos) << Render("a\n{% if x %}");
}

TEST(JinjaTest, UndefinedIsEmptyUntilUsed) {
  EXPECT_EQ(Render("[{{ nothing }}][{{ nothing | length }}][{% for x in nothing %}x{% endfor %}]"),
            "[][0][]");
  const std::string used = Render("{{ nothing.attr }}");
  EXPECT_NE(used.find("'nothing' is undefined"), std::string::npos) << used;
  EXPECT_NE(Render("{{ nothing + 1 }}").find("is undefined"), std::string::npos);
  EXPECT_NE(Render("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
  EXPECT_NE(Render("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
}

TEST(JinjaTest, RaiseExceptionStopsTheRender) {
  const std::string out = Render("before{{ raise_exception('no system role') }}after");
  EXPECT_EQ(out, "render error: line 1: no system role");
}

TEST(JinjaTest, LimitsStopRunawayTemplates) {
  EXPECT_NE(Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("too deep"),
            std::string::npos);
  EXPECT_NE(Render("{{ range(1000000) | length }}").find("too many"), std::string::npos);
  EXPECT_NE(Render("{% for i in range(99999) %}{{ 'x' * 1000 }}{% endfor %}").find("too large"),
            std::string::npos);
  EXPECT_NE(Render("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")
                .find("too long"),
            std::string::npos);
  EXPECT_NE(Render("{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}")
                .find("too deep"),
            std::string::npos);
  std::string nested;
  for (int i = 0; i < 500; ++i) nested += "{% if true %}";
  EXPECT_NE(Render(nested).find("too deep"), std::string::npos);
}

TEST(JinjaTest, NamespaceAttributesOnlyAreAssignable) {
  EXPECT_EQ(Render("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}"), "2");
  EXPECT_NE(Render("{% set d = {'n': 1} %}{% set d.n = 2 %}").find("namespace"), std::string::npos);
}

TEST(JinjaTest, ContextKeepsKeyOrder) {
  nlohmann::ordered_json ctx;
  ctx["tool"]["name"] = "f";
  ctx["tool"]["arguments"] = {{"z", 1}, {"a", 2}};
  EXPECT_EQ(Render("{{ tool | tojson }}", ctx), R"({"name": "f", "arguments": {"z": 1, "a": 2}})");
  EXPECT_EQ(Render("{% for k in tool.arguments %}{{ k }}{% endfor %}", ctx), "za");
}

TEST(JinjaTest, ReadsReportsVariables) {
  auto t = Template::Parse(
      "{% for m in messages %}{{ m.content }}{% endfor %}{% if tools %}{% endif %}");
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->Reads("messages"));
  EXPECT_TRUE(t->Reads("tools"));
  EXPECT_FALSE(t->Reads("content"));  // an attribute, not a variable
  EXPECT_FALSE(t->Reads("bos_token"));
}

}  // namespace
}  // namespace tandem::jinja
