// The qevict CLI on bad input (issue 13 item 4): a missing, non-GGUF, truncated or incomplete
// model file and bad flag values each give exactly one "error: ..." line on stderr and a
// non-zero exit (no crash, no abort, no stack of messages), and a failed run leaves no output
// file, not even half of one. Needs no real model: the bad files are made with the GGUF builder.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/gguf_builder.h"

namespace qevict {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int exit_code = -1;  // -1: killed by a signal
  std::string err;     // stderr
};

class CliBadInput : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / ("qevict_cli_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    write("prompt.txt", std::string("The quick brown fox jumps over the lazy dog."));
    write("tiny.txt", std::string("GGUF"));
    write("hello.txt",
          std::string("hello, this is plain text and certainly not a GGUF model file\n"));
    // A model-like file whose last tensor's data is cut off, and one with no tensors at all.
    test::GgufBuilder b;
    b.add_string("general.architecture", "llama")
        .add_u32("llama.block_count", 1)
        .add_tensor("token_embd.weight", {64, 16}, GgmlType::kF32, std::vector<uint8_t>(4096, 0))
        .add_tensor("output_norm.weight", {64}, GgmlType::kF32, std::vector<uint8_t>(256, 0));
    const std::vector<uint8_t> full = b.build().bytes;
    write("truncated.gguf", test::truncated(full, full.size() - 300));
    test::GgufBuilder empty;
    empty.add_string("general.architecture", "llama");
    write("no_tensors.gguf", empty.build().bytes);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  template <typename Bytes>
  static void write(const std::string& name, const Bytes& bytes) {
    std::ofstream f(dir_ / name, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  static std::string path(const std::string& name) { return (dir_ / name).string(); }

  static CliRun run(const std::string& args) {
    const std::string err = path("stderr.txt");
    const std::string cmd =
        std::string("env -u QEVICT_MODEL ") + QEVICT_CLI + " " + args + " >/dev/null 2>" + err;
    const int st = std::system(cmd.c_str());
    CliRun r;
    if (st != -1 && WIFEXITED(st)) r.exit_code = WEXITSTATUS(st);
    std::ifstream in(err);
    std::stringstream ss;
    ss << in.rdbuf();
    r.err = ss.str();
    return r;
  }

  // One line, "error: ...", mentioning `what`; a non-zero exit that is not a signal or abort.
  static void expect_one_error(const std::string& args, const std::string& what) {
    SCOPED_TRACE("qevict " + args);
    const CliRun r = run(args);
    EXPECT_GT(r.exit_code, 0) << r.err;
    EXPECT_LT(r.exit_code, 126) << r.err;
    EXPECT_EQ(r.err.rfind("error: ", 0), 0u) << r.err;
    ASSERT_FALSE(r.err.empty());
    EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "more than one line:\n" << r.err;
    EXPECT_NE(r.err.find(what), std::string::npos) << "want '" << what << "' in: " << r.err;
  }

  static fs::path dir_;
};

fs::path CliBadInput::dir_;

TEST_F(CliBadInput, ModelFiles) {
  const std::string p = " -p hi";
  expect_one_error("tokenize -m " + path("missing.gguf") + p, "cannot open");
  expect_one_error("generate -m " + path("missing.gguf") + p, "cannot open");
  expect_one_error("tokenize -m " + path("hello.txt") + p, "not a GGUF file");
  expect_one_error("tokenize -m " + path("tiny.txt") + p, "too small to be GGUF");
  expect_one_error("tokenize -m " + path("truncated.gguf") + p, "truncated or corrupt");
  expect_one_error("generate -m " + path("truncated.gguf") + p, "truncated or corrupt");
  expect_one_error("perplexity -m " + path("truncated.gguf") + " -f " + path("prompt.txt"),
                   "truncated or corrupt");
  expect_one_error("tokenize -m " + path("no_tensors.gguf") + p, "tokenizer.ggml.model");
  expect_one_error("generate -m " + path("no_tensors.gguf") + p, path("no_tensors.gguf"));
  expect_one_error("bench -m " + path("no_tensors.gguf"), path("no_tensors.gguf"));
  expect_one_error("tokenize -m " + dir_.string() + p, "not a regular file");
}

TEST_F(CliBadInput, FlagValues) {
  // Parse errors (exit 2 or CLI11's code) and validation errors found before the model loads.
  const std::string m = "generate -m " + path("missing.gguf") + " -p hi ";
  expect_one_error(m + "--kv-budget -0.5", "--kv-budget");
  expect_one_error(m + "--kv-budget abc", "--kv-budget");
  expect_one_error(m + "--kv-policy nope", "--kv-policy");
  expect_one_error(m + "--kv-dtype f32", "--kv-dtype");
  expect_one_error(m + "--matmul int4", "--matmul");
  expect_one_error(m + "--kv-policy qevict --kv-bits 3", "--kv-bits must be 2, 4 or auto");
  expect_one_error(m + "--kv-policy qevict --kv-bits four", "--kv-bits");
  expect_one_error(m + "--kv-policy kivi --kv-bits auto", "--kv-bits auto applies to the tiered");
  expect_one_error(m + "--kv-policy qevict --kv-value-bits 3", "--kv-value-bits must be 2 or 4");
  expect_one_error(m + "--kv-policy h2o --kv-value-bits 2",
                   "--kv-value-bits applies to the tiered");
  expect_one_error(m + "--kv-policy qevict --kv-bits auto --kv-value-bits 2",
                   "--kv-value-bits needs --kv-bits 2 or 4");
  expect_one_error(m + "-t -2", "--threads");
  expect_one_error(m + "-c 0", "--ctx-size");
  expect_one_error(m + "-n -5", "--n-predict");
  expect_one_error(m + "--top-p 2", "top-p must be in");
  expect_one_error(m + "--no-such-flag", "--no-such-flag");
  expect_one_error(m + "-f " + path("prompt.txt"), "either -p TEXT or -f FILE");
  expect_one_error("generate -m " + path("missing.gguf"), "no prompt");
  expect_one_error("perplexity -m " + path("missing.gguf") + " -f " + path("prompt.txt") +
                       " --kv-policy qevict --kv-q 1.5",
                   "--kv-q must be in [0, 1]");
  expect_one_error("bench -m " + path("missing.gguf") + " --depths 512,abc", "bad depth list");
  // A flag given twice takes its last value (tools/run.sh passes overrides after its
  // defaults): the run gets past parsing to the missing model, or to the last value's error.
  expect_one_error(m + "--kv-policy qevict --kv-budget 0.2 --prefill-route end --kv-pool 2 "
                       "--prefill-route chunk --kv-pool 0",
                   "cannot open");
  expect_one_error(m + "--kv-budget 0.2 --kv-budget -1", "--kv-budget");
  // chat checks its flags before the model too.
  const std::string c = "chat -m " + path("missing.gguf") + " ";
  expect_one_error(c + "--kv-policy nope", "--kv-policy");
  expect_one_error(c + "-c 0", "--ctx-size");
  expect_one_error(c + "--top-p 2", "top-p must be in");
  expect_one_error(c, "cannot open");
  expect_one_error("nosuchcommand", "subcommand");
  expect_one_error("", "subcommand");
}

TEST_F(CliBadInput, FailedRunsWriteNothing) {
  const fs::path out = dir_ / "out";
  fs::create_directories(out);
  expect_one_error("perplexity -m " + path("truncated.gguf") + " -f " + path("prompt.txt") +
                       " --logits-out " + (out / "logits.npy").string(),
                   "truncated or corrupt");
  expect_one_error("diagnose -m " + path("truncated.gguf") + " -f " + path("prompt.txt") +
                       " --out-dir " + out.string(),
                   "truncated or corrupt");
  EXPECT_TRUE(fs::is_empty(out)) << "a failed run left files in " << out;
}

}  // namespace
}  // namespace qevict
