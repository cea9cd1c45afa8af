// Tests for the chat-template interpreter. The reference is real jinja2 configured as Hugging
// Face's apply_chat_template: tests/golden/chat_golden.json (tools/golden/make_chat_golden.py)
// holds model templates (SmolLM2 as shipped, ChatML, Llama-3/3.1, Qwen2.5, Mistral, Zephyr,
// Gemma) and feature templates rendered over several conversations. Malformed templates must
// give a positioned error, and no input may crash (run under ASan).
#include "chat/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "chat/jinja_value.h"

namespace qevict {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

// tokenizer.chat_template of SmolLM2-135M-Instruct, exactly as the GGUF ships it (the golden
// script checks it against the file with --model).
constexpr char kSmolLM2Template[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ "
    "'<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|im_start|>assistant\n' }}{% endif %}";

const json& golden() {
  static const json data = [] {
    std::ifstream f(QEVICT_TEST_DATA_DIR "/golden/chat_golden.json");
    if (!f) return json();
    return json::parse(f, nullptr, /*allow_exceptions=*/false);
  }();
  return data;
}

std::vector<ChatMessage> conversation(const std::string& name) {
  std::vector<ChatMessage> out;
  for (const json& m : golden()["conversations"][name])
    out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

const json* find_case(const std::string& name) {
  for (const json& c : golden()["cases"])
    if (c["name"] == name) return &c;
  return nullptr;
}

// On a mismatch: the first differing byte and both strings around it.
::testing::AssertionResult same_text(const std::string& got, const std::string& want) {
  if (got == want) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  const size_t from = i < 40 ? 0 : i - 40;
  return ::testing::AssertionFailure()
         << "first difference at byte " << i << " (sizes " << got.size() << " vs " << want.size()
         << ")\n  got:  " << json(got.substr(from, 100)).dump()
         << "\n  want: " << json(want.substr(from, 100)).dump();
}

Expected<std::string> render_case(const json& c) {
  auto t = ChatTemplate::parse(
      golden()["templates"][c["template"].get<std::string>()].get<std::string>());
  if (!t) return t.status();
  return t->render(conversation(c["conversation"]), c["add_generation_prompt"].get<bool>(),
                   c["bos_token"].get<std::string>(), c["eos_token"].get<std::string>());
}

void expect_case(const std::string& name) {
  SCOPED_TRACE(name);
  const json* c = find_case(name);
  ASSERT_NE(c, nullptr) << "no golden case " << name;
  auto r = render_case(*c);
  if (c->contains("expected")) {
    ASSERT_TRUE(r.has_value()) << r.error();
    EXPECT_TRUE(same_text(*r, (*c)["expected"].get<std::string>()));
  } else {
    ASSERT_FALSE(r.has_value()) << "rendered, expected error: " << (*c)["error"];
    EXPECT_THAT(r.error(), StartsWith("chat template: line "));
    EXPECT_THAT(r.error(), HasSubstr((*c)["error"].get<std::string>()));
  }
}

TEST(ChatGolden, FileIsPresentAndComplete) {
  ASSERT_TRUE(golden().is_object())
      << "cannot read " QEVICT_TEST_DATA_DIR "/golden/chat_golden.json";
  EXPECT_GE(golden()["cases"].size(), 100u);
  for (const char* t : {"smollm2", "chatml", "llama3", "llama31", "qwen25", "mistral_v01",
                        "mistral_v03", "zephyr", "gemma"})
    EXPECT_TRUE(golden()["templates"].contains(t)) << t;
}

TEST(ChatGolden, EveryCaseMatchesJinja2) {
  size_t n_rendered = 0, n_errors = 0;
  for (const json& c : golden()["cases"]) {
    expect_case(c["name"].get<std::string>());
    (c.contains("expected") ? n_rendered : n_errors)++;
  }
  EXPECT_GT(n_rendered, 100u);
  EXPECT_GT(n_errors, 10u);
}

// --- SmolLM2, the template of the model we run -------------------------------------------

TEST(ChatSmolLM2, TemplateIsTheOneTheModelShips) {
  EXPECT_EQ(golden()["templates"]["smollm2"].get<std::string>(), kSmolLM2Template);
}

TEST(ChatSmolLM2, OneUserMessage) {
  auto t = ChatTemplate::parse(kSmolLM2Template);
  ASSERT_TRUE(t.has_value()) << t.error();
  auto r = t->render({{"user", "Hello!"}}, true, "<|im_start|>", "<|im_end|>");
  ASSERT_TRUE(r.has_value()) << r.error();
  EXPECT_EQ(*r,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  expect_case("smollm2/user/gen");
  expect_case("smollm2/user/nogen");
}

TEST(ChatSmolLM2, SystemAndUser) {
  expect_case("smollm2/system_user/gen");
  expect_case("smollm2/system_user/nogen");
}

TEST(ChatSmolLM2, MultiTurn) {
  expect_case("smollm2/multi_turn/gen");
  expect_case("smollm2/multi_turn/nogen");
  expect_case("smollm2/system_multi_turn/gen");
  expect_case("smollm2/tricky/gen");
}

TEST(ChatModels, Llama3) {
  for (const char* c : {"user", "system_user", "multi_turn", "tricky"}) {
    expect_case(std::string("llama3/") + c + "/gen");
    expect_case(std::string("llama31/") + c + "/nogen");
  }
}

TEST(ChatModels, Qwen25) {
  for (const char* c : {"user", "system_user", "multi_turn", "system_multi_turn"})
    expect_case(std::string("qwen25/") + c + "/gen");
}

TEST(ChatModels, MistralRaisesOnBadAlternation) {
  expect_case("mistral_v01/multi_turn/nogen");
  expect_case("mistral_v03/system_multi_turn/nogen");
  for (const char* name :
       {"mistral_v01/assistant_first/gen", "mistral_v01/two_users/gen",
        "mistral_v01/system_user/gen", "mistral_v03/two_users/gen", "gemma/system_user/gen"}) {
    const json* c = find_case(name);
    ASSERT_NE(c, nullptr) << name;
    ASSERT_TRUE(c->contains("error")) << name;
    EXPECT_THAT((*c)["error"].get<std::string>(), StartsWith("raise_exception: ")) << name;
    expect_case(name);
  }
  auto t = ChatTemplate::parse(golden()["templates"]["mistral_v01"].get<std::string>());
  ASSERT_TRUE(t.has_value());
  auto r = t->render({{"assistant", "a"}}, false, "<s>", "</s>");
  ASSERT_FALSE(r.has_value());
  EXPECT_THAT(r.error(), HasSubstr("raise_exception: Conversation roles must alternate "
                                   "user/assistant/user/assistant/..."));
}

TEST(ChatChatML, FallbackMatchesTheChatMLTemplate) {
  for (const auto& [conv, msgs] : golden()["conversations"].items()) {
    for (bool gen : {false, true}) {
      const json* c = find_case("chatml/" + conv + (gen ? "/gen" : "/nogen"));
      ASSERT_NE(c, nullptr);
      EXPECT_TRUE(same_text(render_chatml(conversation(conv), gen), (*c)["expected"]))
          << conv << " gen=" << gen;
    }
  }
  EXPECT_EQ(render_chatml({}, true), "<|im_start|>assistant\n");
  EXPECT_EQ(render_chatml({}, false), "");
}

// --- malformed and unsupported templates ---------------------------------------------------

struct BadTemplate {
  const char* source;
  const char* position;  // "line L, col C"
  const char* message;
};

TEST(ChatParse, MalformedTemplatesGivePositionedErrors) {
  const BadTemplate cases[] = {
      {"{% if x %}abc", "line 1, col 1", "unclosed 'if' (missing '{% endif %}')"},
      {"a\n{% for m in messages %}", "line 2, col 1", "unclosed 'for'"},
      {"{{ x ", "line 1, col 1", "unclosed tag (missing '}}')"},
      {"{% if x", "line 1, col 1", "unclosed tag (missing '%}')"},
      {"{% for x in %}", "line 1, col 13", "expected an expression, found end of tag"},
      {"{% if %}", "line 1, col 7", "expected an expression"},
      {"text {% endfor %}", "line 1, col 6", "unexpected 'endfor'"},
      {"{% if a %}{% endfor %}", "line 1, col 11", "unexpected 'endfor'"},
      {"{% else %}", "line 1, col 1", "unexpected 'else'"},
      {"\n  {{ x | nosuch }}", "line 2, col 10", "unsupported filter 'nosuch'"},
      {"{{ x is nosuch }}", "line 1, col 9", "unsupported test 'nosuch'"},
      {"{% macro m() %}{% endmacro %}", "line 1, col 1", "unsupported tag 'macro'"},
      {"{% include 'x' %}", "line 1, col 1", "unsupported tag 'include'"},
      {"{% raw %}{% endraw %}", "line 1, col 1", "unsupported tag 'raw'"},
      {"{% frobnicate %}", "line 1, col 1", "unknown tag 'frobnicate'"},
      {"{{ 'abc }}", "line 1, col 4", "unterminated string literal"},
      {"{{ }}", "line 1, col 1", "empty expression"},
      {"{% set x %}y{% endset %}", "line 1, col 10", "block 'set'"},
      {"{% set a, b = 1, 2 %}", "line 1, col 9", "'set' with several targets is not supported"},
      {"{{ x @ y }}", "line 1, col 6", "unexpected character '@'"},
      {"{# never closed", "line 1, col 1", "unclosed comment"},
      {"{% break %}", "line 1, col 1", "'break' outside a for loop"},
      {"{{ 99999999999999999999 }}", "line 1, col 4",
       "integer literal 99999999999999999999 is too large"},
      {"{{ '\\xZZ' }}", "line 1, col 4", "invalid \\x escape"},
      {"{% for x in y recursive %}{% endfor %}", "line 1, col 15",
       "recursive loops are not supported"},
      {"{{ x ) }}", "line 1, col 6", "unbalanced ')'"},
      {"{{ f(1)(2) }}", "line 1, col 8", "only named functions and methods can be called"},
      {"{{ x.1 }}", "line 1, col 6", "expected an attribute name after '.'"},
      {"{{ a b }}", "line 1, col 6", "expected end of tag, found 'b'"},
      {"{{ [1, 2 }}", "line 1, col 11", "unbalanced '}'"},
      {"{{ x[] }}", "line 1, col 5", "empty subscript"},
      {"{{ f(a=1, 2) }}", "line 1, col 11", "positional argument after keyword argument"},
  };
  for (const BadTemplate& b : cases) {
    SCOPED_TRACE(b.source);
    auto t = ChatTemplate::parse(b.source);
    ASSERT_FALSE(t.has_value());
    EXPECT_THAT(t.error(), StartsWith(std::string("chat template: ") + b.position + ": "));
    EXPECT_THAT(t.error(), HasSubstr(b.message));
    EXPECT_EQ(t.error().find('\n'), std::string::npos) << t.error();
  }
}

TEST(ChatParse, DeepNestingIsAnErrorNotAStackOverflow) {
  const std::string parens = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  auto a = ChatTemplate::parse(parens);
  ASSERT_FALSE(a.has_value());
  EXPECT_THAT(a.error(), HasSubstr("nested too deeply"));
  std::string ifs;
  for (int i = 0; i < 5000; ++i) ifs += "{% if true %}";
  auto b = ChatTemplate::parse(ifs);
  ASSERT_FALSE(b.has_value());
  EXPECT_THAT(b.error(), HasSubstr("nested too deeply"));
  auto c = ChatTemplate::parse("{{ " + std::string(5000, '-') + "1 }}");
  ASSERT_FALSE(c.has_value());
  auto d = ChatTemplate::parse("{{ " + std::string(3000, '[') + " }}");
  ASSERT_FALSE(d.has_value());
  // Moderate nesting is fine.
  auto e = ChatTemplate::parse("{{ " + std::string(20, '(') + "1" + std::string(20, ')') + " }}");
  ASSERT_TRUE(e.has_value()) << e.error();
  // Chains built by loops, not recursion (the fuzzer's 1,000-deep a.b.c... overflowed the
  // interpreter's stack; corpus/chat_template_fuzz/regress_deep_attr_chain): every kind is
  // refused past kMaxExprTreeDepth levels, and freeing the tree does not recurse either.
  auto chain = [](const std::string& head, const std::string& link, int n) {
    std::string x = head;
    for (int i = 0; i < n; ++i) x += link;
    return x;
  };
  for (const std::string& deep :
       {chain("{{ a", ".b", 50000) + " }}", chain("{{ 1", " + 1", 20000) + " }}",
        chain("{{ 'x'", " ~ 'y'", 20000) + " }}", chain("{{ x", "|trim", 20000) + " }}",
        chain("{{ x", "[0]", 20000) + " }}", chain("{% set y = 1", " * 2", 20000) + " %}",
        chain("{% if a", " or b", 20000) + " %}{% endif %}"}) {
    auto t = ChatTemplate::parse(deep);
    ASSERT_FALSE(t.has_value()) << deep.substr(0, 20);
    EXPECT_THAT(t.error(), HasSubstr("nested too deeply")) << deep.substr(0, 20);
  }
  auto ok = ChatTemplate::parse(chain("{{ messages", "[0]", 60) + " }}");
  ASSERT_TRUE(ok.has_value()) << ok.error();
}

TEST(ChatRender, ErrorsNameTheProblemAndPosition) {
  auto render = [](const std::string& src) -> Expected<std::string> {
    auto t = ChatTemplate::parse(src);
    if (!t) return t.status();
    return t->render({{"user", "hi"}}, false, "", "");
  };
  EXPECT_EQ(render("ab\n  {{ raise_exception('bad ' ~ messages|length) }}").error(),
            "chat template: line 2, col 6: raise_exception: bad 1");
  EXPECT_THAT(render("{{ strftime_now('%Y') }}").error(),
              HasSubstr("line 1, col 4: unsupported function 'strftime_now'"));
  // Guarded optional functions are fine (Llama-3.2 does this).
  auto guarded = render(
      "{% if strftime_now is defined %}{{ strftime_now('%d') }}{% else %}26 Jul 2024{% endif %}");
  ASSERT_TRUE(guarded.has_value()) << guarded.error();
  EXPECT_EQ(*guarded, "26 Jul 2024");
  EXPECT_THAT(render("{{ 'x'.zfill(3) }}").error(),
              HasSubstr("'str' object has no method 'zfill'"));
  EXPECT_THAT(render("{% set x = 1 %}{% set x.a = 2 %}").error(),
              HasSubstr("cannot assign attribute 'a' of 'x': not a namespace()"));
  EXPECT_THAT(render("{{ messages[0].role.upper().nope.x }}").error(),
              HasSubstr("'nope' is undefined"));
  EXPECT_THAT(render("{{ 'x' * 100000000 }}").error(), HasSubstr("repetition result too large"));
  EXPECT_THAT(render("{{ [1, 2] * 200000 }}").error(), HasSubstr("repetition result too large"));
  // Empty sequences repeat instantly however large the count.
  EXPECT_EQ(*render("{{ ('' * 9223372036854775807) | length }}{{ [] * 9223372036854775807 }}"),
            "0[]");
  EXPECT_EQ(*render("{{ 'ab' * 3 }}{{ 'ab' * -1 }}{{ [1] * 2 }}{{ (1,) * 2 }}"),
            "ababab[1, 1](1, 1)");
  EXPECT_THAT(render("{{ range(100000000) | length }}").error(), HasSubstr("range() too large"));
  EXPECT_THAT(render("{{ 9223372036854775807 + 1 }}").error(), HasSubstr("integer overflow"));
  EXPECT_THAT(render("{{ 3 ** 40 }}").error(), HasSubstr("integer overflow"));
  EXPECT_EQ(
      *render("{{ 1 ** 9223372036854775807 }} {{ 2 ** 62 }} {{ (-1) ** 9223372036854775807 }}"),
      "1 4611686018427387904 -1");  // by squaring: no 2^63-step loop
  EXPECT_EQ(*render("{{ 'abc'[1::9223372036854775807] }}{{ [1, 2, 3][::-9223372036854775807] }}"
                    "{{ 'abc'[-9223372036854775807:9223372036854775807] }}"),
            "b[3]abc");
  // Work is bounded: loop iterations, and the size of strings and lists built by doubling.
  EXPECT_THAT(render("{% for i in range(65536) %}{% for j in range(65536) %}{% endfor %}"
                     "{% endfor %}")
                  .error(),
              HasSubstr("too many loop iterations"));
  EXPECT_THAT(render("{% set ns = namespace(s='ab') %}{% for i in range(40) %}"
                     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                  .error(),
              testing::AnyOf(HasSubstr("string concatenation result too large"),
                             HasSubstr("too much work")));  // whichever bound comes first
  EXPECT_THAT(render("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                     "{% set ns.l = ns.l + ns.l %}{% endfor %}")
                  .error(),
              HasSubstr("list concatenation result too large"));
  EXPECT_THAT(render("{{ ('x' * 1000) | replace('', 'y' * 100000) }}").error(),
              HasSubstr("replace result too large"));
  EXPECT_THAT(render("{{ 'a' % 1 }}").error(), HasSubstr("string formatting with '%'"));
  EXPECT_THAT(render("{{ none | length }}").error(), HasSubstr("'NoneType' has no len()"));
  EXPECT_THAT(render("{{ messages | tojson(indent=2) }}").error(),
              HasSubstr("unexpected keyword argument 'indent'"));
  EXPECT_THAT(render("{{ nothing | tojson }}").error(), HasSubstr("tojson: value is undefined"));
  // Output is bounded (64 MiB).
  EXPECT_THAT(render("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}").error(),
              HasSubstr("output exceeds 64 MiB"));
  // Total work is bounded (RenderLimits::max_work): each of these ran for hours within the
  // bounds above (found by tests/fuzz/chat_template_fuzz; corpus/chat_template_fuzz/regress_*).
  EXPECT_THAT(render("{% for i in range(65536) %}{% for j in range(16) %}"
                     "{% set x = 'a' * 60000000 %}{% endfor %}{% endfor %}")
                  .error(),
              HasSubstr("too much work"));
  EXPECT_THAT(render("{% set s = 'x' * 60000000 %}{% for i in range(65536) %}"
                     "{% set x = s.replace('a', 'b') %}{% endfor %}")
                  .error(),
              HasSubstr("too much work"));
  // Characters are not materialized as one string each (~40x the bytes) to index, slice,
  // replace(''), or iterate a large string; iterating one is bounded like a list.
  EXPECT_THAT(render("{{ ('a' * 4000000).replace('', 'bbbbbbbbbbbbbbbbbbbb') }}").error(),
              HasSubstr("replace result too large"));
  EXPECT_EQ(*render("{% set s = 'ab' * 1000000 %}{{ s[-1] }}{{ s[5:9] }}{{ s[::-1][:3] }}"),
            "b"
            "baba"
            "bab");
  EXPECT_THAT(render("{% for c in 'a' * 1000000 %}{% endfor %}").error(),
              HasSubstr("too long to iterate"));
  // Callers may tighten the bounds (the fuzz target does).
  auto t = ChatTemplate::parse("{% for i in range(100) %}x{% endfor %}");
  ASSERT_TRUE(t.has_value());
  RenderLimits small;
  small.max_iterations = 10;
  EXPECT_THAT(t->render({}, false, "", "", small).error(),
              HasSubstr("too many loop iterations (more than 10)"));
}

TEST(ChatRender, ContentIsNeverInterpreted) {
  auto t = ChatTemplate::parse(kSmolLM2Template);
  ASSERT_TRUE(t.has_value());
  auto r = t->render({{"user", "{{ raise_exception('x') }}{% if %}"}}, false, "", "");
  ASSERT_TRUE(r.has_value()) << r.error();
  EXPECT_THAT(*r, HasSubstr("user\n{{ raise_exception('x') }}{% if %}<|im_end|>"));
}

TEST(ChatRender, KnownDifferenceCaseMappingIsAscii) {
  // Python's str.upper() maps non-ASCII letters too ('é' -> 'É'); ours leaves them unchanged.
  auto t = ChatTemplate::parse("{{ 'abc\xc3\xa9' | upper }}");
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(*t->render({}, false, "", ""), "ABC\xc3\xa9");
}

TEST(ChatTemplateApi, CopiesShareTheParsedTemplate) {
  auto t = ChatTemplate::parse("{{ bos_token }}{{ messages | length }}{{ eos_token }}");
  ASSERT_TRUE(t.has_value());
  ChatTemplate copy = *t;
  EXPECT_EQ(copy.source(), t->source());
  EXPECT_EQ(*copy.render({{"user", "a"}, {"assistant", "b"}}, false, "<s>", "</s>"), "<s>2</s>");
  EXPECT_EQ(*t->render({}, false, "", ""), "0");
}

// --- values --------------------------------------------------------------------------------

TEST(JinjaValue, FloatReprMatchesPython) {
  // repr() of these floats in CPython 3.
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"},
      {0.30000000000000004, "0.30000000000000004"},
      {1e16, "1e+16"},
      {1e15, "1000000000000000.0"},
      {123456789.123, "123456789.123"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {-2.5, "-2.5"},
      {0.0001, "0.0001"},
      {0.00001, "1e-05"},
      {1.5e-7, "1.5e-07"},
      {3.0, "3.0"},
      {-0.0, "-0.0"},
      {123456789012345678.0, "1.2345678901234568e+17"},
  };
  for (const auto& [v, want] : cases) EXPECT_EQ(jinja::python_float_repr(v), want) << want;
}

// --- robustness: no input crashes ----------------------------------------------------------

void parse_and_render(const std::string& src) {
  auto t = ChatTemplate::parse(src);
  if (!t) {
    EXPECT_THAT(t.error(), StartsWith("chat template: line "));
    return;
  }
  auto r = t->render({{"system", "s"}, {"user", "u"}, {"assistant", "a"}}, true, "<s>", "</s>");
  if (!r) {
    EXPECT_THAT(r.error(), StartsWith("chat template: line "));
  }
}

TEST(ChatRobustness, EveryPrefixOfEveryGoldenTemplate) {
  size_t n = 0;
  for (const auto& [name, text] : golden()["templates"].items()) {
    const std::string src = text.get<std::string>();
    for (size_t len = 0; len <= src.size(); ++len, ++n) parse_and_render(src.substr(0, len));
  }
  EXPECT_GT(n, 5000u);
}

TEST(ChatRobustness, SeededMutationsOfGoldenTemplates) {
  std::vector<std::string> sources;
  for (const auto& [name, text] : golden()["templates"].items())
    sources.push_back(text.get<std::string>());
  ASSERT_FALSE(sources.empty());
  const std::string alphabet = "{}%#-+()[]'\"|.~:,=<>!*/ \n\\abxin0129_";
  std::mt19937 rng(20240607);  // fixed seed: failures reproduce
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s = sources[rng() % sources.size()];
    const int n_edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n_edits && !s.empty(); ++k) {
      const size_t at = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          s.erase(at, 1 + rng() % 8);
          break;
        default:
          s.insert(at, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    SCOPED_TRACE(iter);
    parse_and_render(s);
  }
}

}  // namespace
}  // namespace qevict
