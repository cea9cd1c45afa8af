// The qevict subcommands. Each add_* registers its flags on a CLI11 subcommand and returns
// the function that runs it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace qevict::cli {

using Runner = std::function<int()>;

Runner add_generate(CLI::App& app);
Runner add_chat(CLI::App& app);
Runner add_perplexity(CLI::App& app);
Runner add_tokenize(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_diagnose(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_serve(CLI::App& app);

}  // namespace qevict::cli
