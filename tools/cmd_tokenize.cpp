// qevict tokenize: token ids of a text, like llama.cpp's llama-tokenize ("id -> 'piece'"
// lines by default, --ids for a Python-style list, --json for machine-readable output).
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli_common.h"
#include "commands.h"

namespace qevict::cli {

namespace {

struct TokenizeArgs {
  ModelOptions model;
  std::string prompt, file;
  bool json = false, ids = false, no_parse_special = false, add_special = false;
};

int run_tokenize(const TokenizeArgs& a) {
  auto path = resolve_model_path(a.model.model_path);
  if (!path) return fail(path.error());
  auto f = GgufFile::open(*path);
  if (!f) return fail(f.error());
  auto tok = Tokenizer::from_gguf(**f);
  if (!tok) return fail(tok.error());
  auto text = read_prompt(a.prompt, a.file);
  if (!text) return fail(text.error());
  const auto ids = tok->encode(*text, a.add_special, !a.no_parse_special);
  if (a.json) {
    nlohmann::json j = nlohmann::json::array();
    for (int32_t id : ids) j.push_back({{"id", id}, {"piece", tok->token_to_piece(id, true)}});
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (a.ids) {
    std::printf("[");
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? ", " : "", ids[i]);
    std::printf("]\n");
  } else {
    for (int32_t id : ids) std::printf("%6d -> '%s'\n", id, tok->token_to_piece(id, true).c_str());
  }
  return 0;
}

}  // namespace

Runner add_tokenize(CLI::App& app) {
  auto a = std::make_shared<TokenizeArgs>();
  app.add_option("-m,--model", a->model.model_path,
                 "GGUF model file (default: $QEVICT_MODEL or the fetched default)");
  app.add_option("-p,--prompt", a->prompt, "text to tokenize");
  app.add_option("-f,--file", a->file, "read the text from a file")->check(CLI::ExistingFile);
  app.add_flag("--json", a->json, "print a JSON array of {id, piece}");
  app.add_flag("--ids", a->ids, "print only the ids, as a list");
  app.add_flag("--no-parse-special", a->no_parse_special,
               "treat special-token text (e.g. <|im_start|>) as plain text");
  app.add_flag("--add-special", a->add_special, "add BOS/EOS as the model's metadata asks");
  return [a] { return run_tokenize(*a); };
}

}  // namespace qevict::cli
