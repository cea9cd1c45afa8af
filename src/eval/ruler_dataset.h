// `qevict eval --dataset FILE.jsonl`: prompts from a file in RULER's format (what its
// prepare.py writes, one JSON object per line), run through every variant like the built-in
// tasks. Fields of a line:
//   input               the prompt text (required; the user turn of the chat template)
//   outputs             the reference answers (required; a list of strings, or one string)
//   answer_prefix       optional: the start of the model's turn. When the input ends with it
//                       (RULER's package appends it to the input), it is cut from the input.
//   length              optional: the length RULER built the line for (its tokens + generated)
//   index / id          optional: the sample's number (an integer; a string id is kept as the
//                       line's source); default: the line's position among the prompts
//   tokens_to_generate  optional (or max_new_tokens): else the file's default
//   task                optional: the task name; else the file's name without .jsonl (RULER's
//                       layout TASK/validation.jsonl or TASK/test.jsonl: the directory's name)
// Blank lines are skipped; any other line that is not such an object is an error naming the
// file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "eval/ruler_tasks.h"

namespace qevict::eval {

struct DatasetOptions {
  int max_new_tokens = 128;  // for lines without tokens_to_generate (RULER's niah value)
  RulerMetric metric = RulerMetric::kMatchAll;  // string_match_all; kMatchPart for qa files
  // The length recorded for the file's cells. 0: the largest "length" of a task's lines rounded
  // up to a multiple of 1024 (a RULER file built for 4096 tokens: 4096); when no line has one,
  // the runner uses the prompts' own tokens + tokens to generate, rounded the same way.
  int64_t length = 0;
};

// The task name of a file's lines that give none (see above).
std::string dataset_task_name(const std::string& path);

// The prompts of one file's text (`path` names it in errors and in task names). Each sample has
// task, length (0 when unknown), sample, input, answer_prefix (leading space dropped, as the
// built-in tasks), expected, max_new_tokens, metric and source set. Errors: a malformed line
// ("FILE:LINE: ..."), a repeated (task, index), no prompt at all.
Expected<std::vector<RulerSample>> parse_dataset(const std::string& text, const std::string& path,
                                                 const DatasetOptions& opts);
// Reads `path` (plain or gzip) and parses it.
Expected<std::vector<RulerSample>> load_dataset(const std::string& path,
                                                const DatasetOptions& opts);

// Rounds a length up to a multiple of 1024.
int64_t round_up_length(int64_t tokens);

}  // namespace qevict::eval
