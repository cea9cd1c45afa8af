// qevict: command-line entry. Subcommands: generate, perplexity, tokenize, bench, diagnose,
// eval, serve.
#include <cstdio>
#include <exception>
#include <map>
#include <string>

#include "commands.h"
#include "kernel_switches.h"

int main(int argc, char** argv) {
  // QEVICT_AMX, QEVICT_Q8, QEVICT_PV_INT8: read here, the library reads no environment; the
  // flags (--amx, --matmul, --pv-int8) apply after, when a command loads its model.
  qevict::cli::apply_env_kernel_switches();
  CLI::App app{"qevict — long-context LLM decoding with a recoverable tiered KV cache"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  std::map<CLI::App*, qevict::cli::Runner> runners;
  auto add = [&](const char* name, const char* desc, qevict::cli::Runner (*fn)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, desc);
    runners[sub] = fn(*sub);
  };
  add("generate", "generate text from a prompt (streams tokens, timing on stderr)",
      qevict::cli::add_generate);
  add("perplexity", "teacher-forced evaluation: perplexity, optional logits dump (.npy)",
      qevict::cli::add_perplexity);
  add("tokenize", "print the token ids of a text, as llama.cpp's llama-tokenize",
      qevict::cli::add_tokenize);
  add("bench", "prefill and decode speed at given context depths (medians)",
      qevict::cli::add_bench);
  add("diagnose", "the paper's diagnostics: FullKV vs R1-R4, StreamingLLM, H2O in lockstep",
      qevict::cli::add_diagnose);
  add("eval", "RULER-style task suite over KV variants and budgets (resumable; JSONL + summary)",
      qevict::cli::add_eval);
  add("serve", "OpenAI-compatible HTTP server: continuous batching, one KV byte pool",
      qevict::cli::add_serve);
  // A flag given twice takes its last value, as in llama.cpp: a script that writes out the
  // defaults (tools/run.sh) passes its extra arguments after them. Single-value options only
  // (lists such as --depths or --budgets keep every value).
  for (CLI::App* sub : app.get_subcommands({}))
    for (CLI::Option* o : sub->get_options())
      if (o->get_items_expected_max() == 1)
        o->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Bad flag or value: one line saying what is wrong and where the usage is, exit 2 (the
    // whole usage text would bury the error).
    std::string where = "qevict";
    for (auto* sub : app.get_subcommands()) where += " " + sub->get_name();
    std::fprintf(stderr, "error: %s (see '%s --help')\n", e.what(), where.c_str());
    return e.get_exit_code() ? e.get_exit_code() : 2;
  }
  // The library returns errors as values; an exception escaping a command (a bug, or out of
  // memory) still ends in one error line and exit 1, not an abort.
  try {
    for (auto* sub : app.get_subcommands()) return runners[sub]();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 2;
}
