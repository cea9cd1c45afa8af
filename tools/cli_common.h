// Shared pieces of the qevict subcommands: model discovery (-m, QEVICT_MODEL, the fetched
// default), thread count, reading prompt text, loading model + tokenizer with clear errors,
// the sessions of chat and generate --prompt-cache, streaming generated text.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <tuple>

#include "core/status.h"
#include "engine/kvquant_calibration.h"
#include "engine/sampling.h"
#include "engine/session.h"
#include "kvcache/factory.h"
#include "kvcache/options.h"
#include "kvcache/params.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace qevict::cli {

// How decode-sized matmuls (calls of fewer than 32 tokens) multiply quantized weights
// (kernels/matmul.h): q8 rounds the activations to 8 bits per 32-block and uses integer dot
// products, as llama.cpp does (fast; on CPUs with AVX-512 VNNI); f32 multiplies exactly.
enum class MatmulMode { kQ8, kF32 };

struct ModelOptions {
  std::string model_path;        // -m
  int threads = 0;               // -t (0: all cores)
  std::string matmul;            // --matmul q8|f32
  std::string amx = "auto";      // --amx auto|on|off
  std::string pv_int8 = "auto";  // --pv-int8 auto|on|off
};

// -m, -t, --matmul, --amx and --pv-int8 (auto: the kernel's default, on where the CPU has it
// unless QEVICT_AMX / QEVICT_PV_INT8 = 0 in the environment, tools/kernel_switches.h). Serving
// commands default to q8; measuring commands (perplexity, eval, diagnose) to f32, so that what they
// compare (KV caches) is not blurred by activation rounding (mean KL 3.5e-3 on SmolLM2, BENCHMARKS
// §2).
void add_model_options(CLI::App& app, ModelOptions& o, MatmulMode default_mode = MatmulMode::kQ8);

// -m PATH, else $QEVICT_MODEL, else the default model fetched by tools/fetch_model.sh.
Expected<std::string> resolve_model_path(const std::string& flag_value);
int resolve_threads(int flag_value);

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  // kvquant's calibrations made so far, by (bits, sparsity, first f16 tokens: they are left out
  // of the levels) (prepare_kv_params).
  std::vector<std::pair<std::tuple<int, double, int>, std::shared_ptr<const KvQuantCalibration>>>
      kvquant;
};
Expected<Loaded> load_model(const ModelOptions& o);

// Sampling flags of generate and chat: --temp, --top-k, --top-p, --min-p, -s/--seed (-1 =
// random: resolve_seed).
void add_sampling_options(CLI::App& app, SamplingParams& s, int64_t& seed);
uint64_t resolve_seed(int64_t flag_value);

// The text of -p, or the contents of -f (exactly one must be given).
Expected<std::string> read_prompt(const std::string& text, const std::string& file);

// KV-cache flags (--kv-policy, --kv-budget, ...) shared by generate, perplexity, bench, serve,
// eval and diagnose: one flag per row of kv_options() (kvcache/options.h), each recorded as
// key=value in the order given and parsed by set_kv_option, the parser eval variants, the
// Python bindings and the server's request fields share.
struct KvOptions {
  KvCacheParams preset;  // values before the flags: a command's own defaults
  KvOptionList list;     // the --kv-* flags given, in order
  bool stats = false;
};
// Which flags: kCache every --kv-* flag (generate, perplexity, bench, serve); kGrid those that
// shape a grid's variants (diagnose, eval: no --kv-policy, --kv-window, --kv-stats, --kv-trace:
// the variants fix them).
enum class KvFlagScope { kCache, kGrid };
void add_kv_options(CLI::App& app, KvOptions& o, KvFlagScope scope = KvFlagScope::kCache);
// The flags applied to the preset, without a policy's defaults (*given: which were set): what
// eval and diagnose finish per variant.
Expected<KvCacheParams> kv_flags(const KvOptions& o, KvParamsGiven* given);
// The flags, then the policy's defaults for options not given, validated.
Expected<KvCacheParams> kv_params(const KvOptions& o);
// What a policy needs from the loaded model before its caches can be made: kvquant's
// calibration (engine/kvquant_calibration.h: the model reads up to 2,048 tokens of the committed
// calibration text; 15 s for SmolLM2-135M on 2 cores, said on stderr). Other policies: nothing.
Status prepare_kv_params(Loaded& l, KvCacheParams* p, int threads);
// The same without running the model: true when p needs nothing or a calibration made before
// fits it (the server's requests: the model is busy decoding).
bool attach_known_calibration(const Loaded& l, KvCacheParams* p);
// --kv-stats: per layer and total — windows per tier, moves, bytes by tier, ledger bytes
// held by promoted windows, routing / quantization time — on stderr.
void print_kv_stats(const SequenceKvCache& cache, double decode_seconds);

// chat and generate --prompt-cache hold their conversation in a Session (engine/session.h).
// Its options from their flags: KV params (kv_params), -c, -b.
SessionOptions session_options(const KvCacheParams& kv, int64_t n_ctx, int prefill_chunk);
// The session saved in `path` (chat's /save, generate --prompt-cache) for this model. With
// `same_as`, the file must have been saved with its KV options and context size, else an error
// naming the first that differs (generate: resuming would silently replace the flags); without,
// the file's own options are taken (chat's /load). Errors name the path; *restored as
// Session::load.
Expected<std::unique_ptr<Session>> load_session(Model& model, const std::string& path,
                                                ThreadPool& pool, const SessionOptions* same_as,
                                                bool* restored = nullptr);

// The tokenizer's end-of-generation tokens: the stop tokens of generate and chat.
std::vector<int32_t> eog_tokens(const Tokenizer& tok);

// Generated tokens as text on stdout, flushed token by token: whole UTF-8 characters only (a
// character split across tokens waits for its last byte); end-of-generation tokens print
// nothing. end() writes what is held back and ends the line.
class TokenText {
 public:
  explicit TokenText(const Tokenizer& tok) : tok_(tok) {}
  void put(int32_t id);
  void end();

 private:
  const Tokenizer& tok_;
  Utf8Streamer utf8_;
};

// A progress bar on stderr for long runs: redrawn in place on a terminal, a line every 10 %
// otherwise (logs); shows the rate and the time left.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  bool tty_;
  int last_ = -1;
  double t0_;
};

// Prints "error: <msg>" on stderr and returns the exit code 1.
int fail(const std::string& msg);

}  // namespace qevict::cli
