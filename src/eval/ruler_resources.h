// The material of RULER-style haystacks, read at run time: real prose (any text file, gzip or
// plain; the CLI's default is the public-domain Jargon File of Debian's jargon-text package)
// and a word list (Debian's wamerican, /usr/share/dict/words). Nothing here is shipped in the
// repository.
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

// Reads both files into RulerResources; errors name the file and the Debian package to install.
Expected<RulerResources> load_ruler_resources(const std::string& haystack_path,
                                              const std::string& haystack_start,
                                              const std::string& words_path);

}  // namespace qevict::eval
