// Long-document tasks: lcc's target is the line after its context in the real file and is code,
// samples are deterministic and fit their length, doc_qa asks about a headword in the middle of
// its excerpt, its reference (the headword's own entry) drawn from a small Jargon-style text,
// and the scores (edit similarity, exact match, ROUGE-L, keyword recall) on hand-worked cases.
#include "eval/longdoc_tasks.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "eval/ruler_resources.h"

namespace qevict::eval {
namespace {

namespace fs = std::filesystem;

// Whitespace-separated words as tokens: a stand-in for a model tokenizer.
Expected<int64_t> count_words(const RulerSample& s) {
  std::istringstream in(s.input + " " + s.answer_prefix);
  int64_t n = 0;
  for (std::string w; in >> w;) ++n;
  return n;
}

// A directory with two generated Python files (one is data, not code) and a test directory.
struct CodeDir {
  fs::path dir;
  CodeDir() {
    dir = fs::temp_directory_path() / ("qevict_lcc_" + std::to_string(::getpid()));
    fs::create_directories(dir / "pkg");
    fs::create_directories(dir / "test");
    std::ofstream code(dir / "pkg" / "mod.py");
    for (int i = 0; i < 400; ++i) {
      code << "def f" << i << "(x):\n";
      code << "    # step " << i << "\n";
      code << "    y = x * " << i << " + " << (i % 7) << "\n";
      code << "\n";
      code << "    return y\n";
    }
    std::ofstream data(dir / "table.py");
    for (int i = 0; i < 3000; ++i) data << "T" << i << " = " << i * 3 << "\n";
    std::ofstream test(dir / "test" / "test_mod.py");
    for (int i = 0; i < 800; ++i) test << "def t" << i << "(): pass\n";
  }
  ~CodeDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

RulerResources prose() {
  RulerResources r;
  for (int i = 0; i < 5000; ++i) {
    // Appended, not `":term" + std::to_string(i)`: GCC 12 warns (-Wrestrict, a false
    // positive) on operator+(const char*, string&&).
    std::string w = i % 97 == 50 ? ":term" : "w";
    w += std::to_string(i);
    if (i % 97 == 50) w += ':';
    r.essay_words.push_back(std::move(w));
  }
  return r;
}

TEST(LongdocTasks, CodeFilesAreCodeOutsideTestDirectories) {
  CodeDir d;
  auto files = find_code_files(d.dir.string(), 1000);
  ASSERT_TRUE(files.has_value()) << files.error();
  ASSERT_EQ(files->size(), 1u);
  EXPECT_EQ(fs::path((*files)[0]).filename(), "mod.py");
  EXPECT_FALSE(find_code_files((d.dir / "missing").string(), 1000).has_value());
}

TEST(LongdocTasks, LccTargetIsTheCodeLineAfterItsContext) {
  CodeDir d;
  RulerResources res;
  res.code_files = *find_code_files(d.dir.string(), 1000);
  for (int sample = 0; sample < 6; ++sample) {
    SCOPED_TRACE(sample);
    auto s = make_ruler_sample("lcc", 600, sample, 0, res, count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_LE(s->prompt_tokens + s->max_new_tokens, 600);
    EXPECT_EQ(s->max_new_tokens, 64);
    EXPECT_EQ(s->metric, RulerMetric::kEditSim);
    EXPECT_TRUE(s->raw);  // no chat template: the model continues the file
    // The file's lines: the target is line N (source "path:N"), the context the lines before.
    const size_t colon = s->source.rfind(':');
    const int line = std::stoi(s->source.substr(colon + 1));
    std::ifstream in(s->source.substr(0, colon));
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    ASSERT_LE(line, int(lines.size()));
    const std::string target = lines[size_t(line - 1)];
    EXPECT_EQ(s->expected.at(0), target.substr(target.find_first_not_of(' ')));
    EXPECT_NE(target.find_first_not_of(' '), std::string::npos);
    EXPECT_NE(target[target.find_first_not_of(' ')], '#');  // a comment is never the target
    // The prompt is the context lines alone, ending with the line before the target.
    const std::string tail = "\n" + lines[size_t(line - 2)] + "\n";
    EXPECT_EQ(s->input.substr(s->input.size() - tail.size()), tail);
    EXPECT_EQ(s->input, [&] {
      std::string c;
      for (int i = line - 1 - int(s->haystack_units); i < line - 1; ++i)
        c += lines[size_t(i)] + "\n";
      return c;
    }());
    // Deterministic, and one more line of context would not fit.
    auto again = make_ruler_sample("lcc", 600, sample, 0, res, count_words);
    EXPECT_EQ(again->input, s->input);
    auto bigger = build_longdoc_sample("lcc", 600, sample, 0, s->haystack_units + 1, res);
    ASSERT_TRUE(bigger.has_value());
    EXPECT_GT(*count_words(*bigger) + 64, 600);
  }
  RulerResources none;
  EXPECT_FALSE(build_longdoc_sample("lcc", 600, 0, 0, 50, none).has_value());
  // No file is long enough for 100K tokens of context.
  EXPECT_FALSE(build_longdoc_sample("lcc", 100000, 0, 0, 50, res).has_value());
}

TEST(LongdocTasks, DocQaAsksAboutAHeadwordInTheMiddleOfItsExcerpt) {
  const RulerResources res = prose();
  for (int sample = 0; sample < 5; ++sample) {
    auto s = make_ruler_sample("doc_qa", 1000, sample, 0, res, count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    EXPECT_LE(s->prompt_tokens + s->max_new_tokens, 1000);
    EXPECT_EQ(s->metric, RulerMetric::kAgreeFull);
    EXPECT_FALSE(s->raw);  // a question to a chat model: its template
    ASSERT_EQ(s->source.front(), ':');
    const size_t at = s->input.find(" " + s->source + " ");
    ASSERT_NE(at, std::string::npos) << s->source << " is not in the document";
    const size_t q = s->input.find("\n\nQuestion:");
    EXPECT_GT(at, q / 5);
    EXPECT_LT(at, q - q / 5);
    EXPECT_NE(s->input.find("about the term '" + s->source + "'"), std::string::npos);
    auto sum = make_ruler_sample("doc_sum", 1000, sample, 0, res, count_words);
    ASSERT_TRUE(sum.has_value());
    EXPECT_EQ(sum->answer_prefix, "Summary:");
  }
}

TEST(LongdocScoring, EditSimilarityExactMatchAndRougeL) {
  // First code line: fences and comments are skipped; indentation does not count.
  EXPECT_DOUBLE_EQ(code_line_similarity("```python\n    return y\n```", "return y"), 1.0);
  EXPECT_TRUE(code_line_exact("\n\n  x = 1\ny = 2", "x = 1"));
  EXPECT_FALSE(code_line_exact("x = 2", "x = 1"));
  // "abcd" vs "abxd": LCS 3 of 8 characters -> 0.75.
  EXPECT_DOUBLE_EQ(code_line_similarity("abcd", "abxd"), 0.75);
  EXPECT_DOUBLE_EQ(code_line_similarity("", "abc"), 0.0);
  EXPECT_DOUBLE_EQ(score_ruler(RulerMetric::kEditSim, "abcd", {"abxd"}), 0.75);
  // ROUGE-L over words: LCS "the cat" of 3 and 4 words: P 2/3, R 2/4 -> F 4/7.
  EXPECT_NEAR(rouge_l_f1("The cat sat", "the big cat ran"), 4.0 / 7.0, 1e-12);
  EXPECT_DOUBLE_EQ(rouge_l_f1("Same words.", "same, words"), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l_f1("", ""), 1.0);
  EXPECT_DOUBLE_EQ(rouge_l_f1("a", ""), 0.0);
  EXPECT_NEAR(score_ruler(RulerMetric::kAgreeFull, " The cat sat\n", {"the big cat ran"}),
              4.0 / 7.0, 1e-12);
}

// Entries in the Jargon File's layout (indented, blank lines, curly quotes, cross-references
// in braces), split into words as the haystack is (prose_words).
const char* kJargonStyle =
    "   :bogometer: /boh\xc2\xb7gom'@\xc2\xb7ter/, n.\n\n"
    "   A notional instrument for measuring {bogosity}. Compare the\n"
    "   {Troll-O-Meter}; see also {bogus} sense 1.\n\n"
    "   :bogon: /boh'gon/, n.\n\n"
    "   [very common; by analogy with proton/electron/neutron, see the Bibliography.\n"
    "   Note [nested] brackets]\n\n"
    "   1. The elementary particle of bogosity (see {quantum bogodynamics}). For\n"
    "   instance, \xe2\x80\x9cthe Ethernet is emitting bogons again\xe2\x80\x9d.\n\n"
    "   2. A query packet sent from a TCP/IP domain resolver.\n\n"
    "   :bogon filter: /boh'gon fil'tr/, n.\n\n"
    "   Any device, software or hardware, that limits the flow of bogons.\n\n"
    "   :cuspy: /kuhs'pee/, adj.\n\n"
    "   [WPI: from the DEC abbreviation CUSP] Said esp. of software. Functionally\n"
    "   elegant, e.g. a cuspy hack; well-written. Compare {kludge}.\n\n"
    "   :ARMM: n.\n\n"
    "   [acronym, \xe2\x80\x98"
    "Automated Retroactive Minimal Moderation\xe2\x80\x99] A Usenet\n"
    "   {cancelbot} created by Dick Depew.\n\n"
    "   :frob: n.,vt.\n\n"
    "   The term means to fiddle with, as the document says. Tweak it.\n\n"
    "   :wedged: adj.\n\n"
    "   1. [Unix] To be stuck, incapable of proceeding without help. This\n"
    "   is different from having crashed.\n";

std::vector<std::string> jargon_words() { return prose_words(kJargonStyle, ""); }

size_t index_of(const std::vector<std::string>& w, const std::string& word) {
  return size_t(std::find(w.begin(), w.end(), word) - w.begin());
}

TEST(DocQaReference, EntryOfAHeadwordInJargonLayout) {
  using Words = std::vector<std::string>;
  using Keys = std::vector<Words>;
  const auto w = jargon_words();
  // Pronunciation and part of speech dropped; the entry ends at the next headword. One sense:
  // "sense 1." of a cross-reference starts none.
  auto r = jargon_entry_reference(w, index_of(w, ":bogometer:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->entry,
            "A notional instrument for measuring {bogosity}. Compare the {Troll-O-Meter}; see "
            "also {bogus} sense 1.");
  EXPECT_EQ(r->sentences, Words{"A notional instrument for measuring {bogosity}."});
  EXPECT_EQ(r->keywords, (Keys{{"notional", "instrument", "measuring", "bogosity"}}));
  // A bracketed note (with brackets inside) before sense 1, and sense 2; the next headword has
  // two words (":bogon filter:"). The note has 3 keywords or more: a candidate too.
  r = jargon_entry_reference(w, index_of(w, ":bogon:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->entry.substr(0, 20), "[very common; by ana");
  EXPECT_EQ(r->entry.substr(r->entry.size() - 25), "a TCP/IP domain resolver.");
  EXPECT_EQ(r->sentences, (Words{"[very common; by analogy with proton/electron/neutron, see the "
                                 "Bibliography. Note [nested] brackets]",
                                 "The elementary particle of bogosity (see {quantum "
                                 "bogodynamics}).",
                                 "A query packet sent from a TCP/IP domain resolver."}));
  // "bogons" would be the term's own word; "bogodynamics" loses its plural 's'.
  EXPECT_EQ(r->keywords, (Keys{{"common", "analogy", "proton", "electron", "neutron",
                                "bibliography", "note", "nested", "bracket"},
                               {"elementary", "particle", "bogosity", "quantum", "bogodynamic"},
                               {"query", "packet", "sent", "tcp", "ip", "domain", "resolver"}}));
  // The score is the best sense's keyword recall: sense 2 in full, or 2 of sense 1's 5.
  EXPECT_DOUBLE_EQ(
      reference_recall("A bogon is a query packet sent from a TCP/IP domain resolver.", *r), 1.0);
  EXPECT_DOUBLE_EQ(reference_recall("An elementary particle.", *r), 0.4);
  EXPECT_DOUBLE_EQ(reference_recall("A bogon.", *r), 0.0);
  // "esp." ends no sentence; "Said ... software." has one keyword, so the next sentence
  // joins it ("e.g." inside it ends nothing either).
  r = jargon_entry_reference(w, index_of(w, ":cuspy:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->sentences, (Words{"[WPI: from the DEC abbreviation CUSP]",
                                 "Said esp. of software. Functionally elegant, e.g. a cuspy hack; "
                                 "well-written."}));
  EXPECT_EQ(r->keywords,
            (Keys{{"wpi", "dec", "cusp"},
                  {"software", "functionally", "elegant", "hack", "well", "written"}}));
  // An acronym's expansion in its note is a candidate before the definition; a note of
  // fewer than 3 keywords ("[Unix]", below) is none.
  r = jargon_entry_reference(w, index_of(w, ":ARMM:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->sentences.size(), 2u);
  EXPECT_EQ(r->keywords, (Keys{{"automated", "retroactive", "minimal", "moderation"},
                               {"usenet", "cancelbot", "created", "dick", "depew"}}));
  EXPECT_DOUBLE_EQ(reference_recall("A synonym for Automated Retroactive Minimal Moderation.", *r),
                   1.0);
  // Part of speech "n.,vt." without pronunciation; the answer-frame words are no keywords, and
  // an entry whose sentences never reach 3 keywords gives what it has.
  r = jargon_entry_reference(w, index_of(w, ":frob:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->entry, "The term means to fiddle with, as the document says. Tweak it.");
  EXPECT_EQ(r->keywords, (Keys{{"fiddle", "tweak"}}));
  // The last entry runs to the end of the excerpt; one cut short keeps what the excerpt has.
  r = jargon_entry_reference(w, index_of(w, ":wedged:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->sentences, (Words{"To be stuck, incapable of proceeding without help."}));
  const Words cut(w.begin(), w.begin() + ptrdiff_t(index_of(w, ":wedged:") + 7));
  r = jargon_entry_reference(cut, index_of(w, ":wedged:"));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->entry, "1. [Unix] To be stuck,");
  EXPECT_EQ(r->keywords, (Keys{{"stuck"}}));
  // Not a one-word headword: no reference.
  EXPECT_FALSE(jargon_entry_reference(w, index_of(w, ":bogon")).has_value());
  EXPECT_FALSE(jargon_entry_reference(w, index_of(w, "notional")).has_value());
  EXPECT_FALSE(jargon_entry_reference(w, w.size()).has_value());
  const Words bare = {":lonely:", "n."};
  EXPECT_FALSE(jargon_entry_reference(bare, 0).has_value());  // no words, no keywords
}

TEST(DocQaReference, FromTheSampleItsPromptAndTerm) {
  RulerResources res;
  const auto w = jargon_words();
  while (res.essay_words.size() < 4000)
    res.essay_words.insert(res.essay_words.end(), w.begin(), w.end());
  int found = 0;
  for (int sample = 0; sample < 6; ++sample) {
    auto s = make_ruler_sample("doc_qa", 1500, sample, 0, res, count_words);
    ASSERT_TRUE(s.has_value()) << s.error();
    auto r = doc_qa_reference(*s);
    ASSERT_TRUE(r.has_value()) << s->source;
    // The excerpt repeats the text: the entry is the one the term heads in the text itself
    // (unless the excerpt cut it, which 1,500 words around a middle headword do not).
    auto want = jargon_entry_reference(w, index_of(w, s->source));
    ASSERT_TRUE(want.has_value());
    EXPECT_EQ(r->sentences, want->sentences);
    EXPECT_EQ(r->keywords, want->keywords);
    found += 1;
    auto sum = make_ruler_sample("doc_sum", 1500, sample, 0, res, count_words);
    EXPECT_FALSE(doc_qa_reference(*sum).has_value());
  }
  EXPECT_EQ(found, 6);
  // An excerpt without headwords asks about its middle word: no reference.
  RulerResources plain;
  for (int i = 0; i < 3000; ++i) {
    std::string word = "w";  // appended: see prose()
    word += std::to_string(i);
    plain.essay_words.push_back(std::move(word));
  }
  auto s = make_ruler_sample("doc_qa", 1000, 0, 0, plain, count_words);
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(doc_qa_reference(*s).has_value());
}

TEST(DocQaReference, ContentWordsAndKeywordRecall) {
  // Lowercase, plural 's' dropped (not from "ss" or three letters), stopwords and the answer's
  // frame words dropped, distinct in order.
  EXPECT_EQ(content_words("The hackers' Bus: this process; themselves, a BOGONS bogon. It says"),
            (std::vector<std::string>{"hacker", "bus", "process", "bogon"}));
  const std::vector<std::string> keys = {"notional", "instrument", "measuring", "bogosity"};
  // 3 of 4: "measure" is not "measuring" (no stemming beyond the plural).
  EXPECT_DOUBLE_EQ(keyword_recall("The term 'bogometer' refers to notional INSTRUMENTS used to "
                                  "measure bogosity.",
                                  keys),
                   0.75);
  EXPECT_DOUBLE_EQ(keyword_recall("A notional instrument for measuring bogosity.", keys), 1.0);
  EXPECT_DOUBLE_EQ(keyword_recall("The document says the term refers to something.", keys), 0.0);
  EXPECT_EQ(content_words("A term used, especially, to describe a tool."),
            std::vector<std::string>{"tool"});
  EXPECT_DOUBLE_EQ(keyword_recall("", keys), 0.0);
  // Contractions leave no keyword fragments; "sense 2" of a cross-reference is no content.
  EXPECT_EQ(content_words("It hasn't died (see {de-rezz} sense 2)."),
            (std::vector<std::string>{"died", "de", "rezz"}));
  EXPECT_DOUBLE_EQ(keyword_recall("anything", {}), 0.0);
}

}  // namespace
}  // namespace qevict::eval
