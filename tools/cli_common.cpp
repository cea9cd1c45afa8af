// See cli_common.h.
#include "cli_common.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace qevict::cli {

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option("-m,--model", o.model_path,
                 "GGUF model file (default: $QEVICT_MODEL, else the model fetched by tools/fetch_model.sh)");
  app.add_option("-t,--threads", o.threads, "threads to use (default: all cores)")->check(CLI::NonNegativeNumber);
}

static std::string default_cache_dir() {
  if (const char* c = std::getenv("QEVICT_CACHE")) return c;
  if (const char* x = std::getenv("XDG_CACHE_HOME")) return std::string(x) + "/qevict";
  if (const char* h = std::getenv("HOME")) return std::string(h) + "/.cache/qevict";
  return ".cache/qevict";
}

Expected<std::string> resolve_model_path(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("QEVICT_MODEL"); env && *env) return std::string(env);
  std::string def = default_cache_dir() + "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
  std::ifstream probe(def);
  if (probe.good()) return def;
  return Status::error(fmt::format(
      "no model given and the default model is not at {}: pass -m PATH, set QEVICT_MODEL, or run tools/fetch_model.sh",
      def));
}

int resolve_threads(int flag_value) {
  if (flag_value > 0) return flag_value;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? static_cast<int>(hc) : 1;
}

Expected<Loaded> load_model(const ModelOptions& o) {
  auto path = resolve_model_path(o.model_path);
  if (!path) return path.status();
  auto m = Model::load(*path);
  if (!m) return m.status();
  auto tok = Tokenizer::from_gguf((*m)->gguf());
  if (!tok) return tok.status();
  Loaded l;
  l.model = std::move(*m);
  l.tokenizer = std::make_unique<Tokenizer>(std::move(*tok));
  return l;
}

Expected<std::string> read_prompt(const std::string& text, const std::string& file) {
  if (!text.empty() && !file.empty()) return Status::error("give either -p TEXT or -f FILE, not both");
  if (!file.empty()) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Status::error(fmt::format("{}: cannot open", file));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  if (text.empty()) return Status::error("no prompt: give -p TEXT or -f FILE");
  return text;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}

}  // namespace qevict::cli
