// The material of RULER-style haystacks, read at run time: real prose (any text file, gzip or
// plain; the CLI's default is the public-domain Jargon File of Debian's jargon-text package, or
// RULER's own Paul Graham essays from tools/fetch_ruler_data.sh's directory) and a word list
// (Debian's wamerican, /usr/share/dict/words). Nothing here is shipped in the repository.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "eval/ruler_tasks.h"

namespace qevict::eval {

// The whole content of a file, decompressed when it is gzip (plain files are read as they are).
Expected<std::string> read_text_file(const std::string& path);

// The words of `text` (split on whitespace) from the first occurrence of `start` on (the whole
// text when `start` is empty or absent), without tokens that hold no letter or digit (rules,
// box drawing). No-break spaces count as whitespace. RULER likewise collapses its essays'
// whitespace before splitting.
std::vector<std::string> prose_words(const std::string& text, const std::string& start);

// Distinct lines of `text` made of 3 to 10 lowercase ASCII letters, sorted (drops proper
// nouns, possessives and rare long words of a dictionary word list).
std::vector<std::string> plain_words(const std::string& text);

// The words of `text` split on runs of whitespace, as RULER splits its essays
// (re.sub(r"\s+", " ", text).split(" "), without the empty ends).
std::vector<std::string> whitespace_words(const std::string& text);

// RULER's essay haystack: the "text" of PaulGrahamEssays.json in `ruler_data_dir`, in words.
Expected<std::vector<std::string>> load_essay_words(const std::string& ruler_data_dir);

// What `qevict eval --haystack ARG` is recorded as on every result line: "jargon" and "essay"
// as they are, any other ARG (a path to a text file) as "file:" and its file name.
std::string haystack_name(const std::string& arg);

// Reads both files into RulerResources; errors name the file and the Debian package to install.
Expected<RulerResources> load_ruler_resources(const std::string& haystack_path,
                                              const std::string& haystack_start,
                                              const std::string& words_path);

}  // namespace qevict::eval
