// qevict diagnose: the paper's diagnostics (SPEC §8) on any model — FullKV and the variants
// R1–R4, StreamingLLM and H2O decode the same tokens in lockstep; writes diagnostics.json
// (every number and the configuration), diagnostics.md (summary) and fullkv_attention.npy
// (FullKV's attention per decode step, layer/head-averaged) into --out-dir.
// Plots: tools/diagnostics/plot_diagnostics.py DIR/diagnostics.json.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "core/atomic_file.h"
#include "core/npy.h"
#include "eval/diagnose.h"

namespace qevict::cli {

namespace {

struct DiagnoseArgs {
  ModelOptions model;
  std::string file;
  std::string out_dir = "results/diagnostics";
  std::string variants = "R1,R2,R3,R4,streaming,h2o";
  KvOptions kv;  // the shared --kv-* flags that shape R1–R4 (KvFlagScope::kGrid)
  eval::DiagnoseOptions opts;
};

int run_diagnose_cmd(DiagnoseArgs a) {
  std::vector<std::string> names;
  {
    std::stringstream ss(a.variants);
    std::string n;
    while (std::getline(ss, n, ','))
      if (!n.empty()) names.push_back(n);
  }
  a.opts.variants = names;
  KvParamsGiven given;
  auto base = kv_flags(a.kv, &given);
  if (!base) return fail(base.error());
  a.opts.base = *base;
  a.opts.base.policy = "qevict";  // R1–R4; variant_params sets every variant's own
  a.opts.budget_bytes = base->budget_bytes;
  a.opts.budget = a.opts.budget_bytes > 0 ? 0.0 : base->budget_fraction;
  Status v = a.opts.validate();
  if (!v) return fail(v.message());
  for (const auto& n : names) {
    auto p = eval::variant_params(n, a.opts);
    if (!p) return fail(p.error());
  }
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  auto text = read_prompt("", a.file);
  if (!text) return fail(text.error());
  std::vector<int32_t> tokens =
      loaded->tokenizer->encode(*text, /*add_special=*/false, /*parse_special=*/false);
  if (loaded->tokenizer->bos() >= 0) tokens.insert(tokens.begin(), loaded->tokenizer->bos());
  if (int64_t(tokens.size()) < a.opts.prefill)
    return fail(fmt::format("{}: {} tokens, fewer than --prefill {}", a.file, tokens.size(),
                            a.opts.prefill));
  std::error_code ec;
  std::filesystem::create_directories(a.out_dir, ec);
  if (ec) return fail(fmt::format("{}: cannot create: {}", a.out_dir, ec.message()));

  const int threads = resolve_threads(a.model.threads);
  for (const auto& n : names)
    if (n == "kvquant") {  // its calibration runs the model once (variant_params copies base's)
      auto p = eval::variant_params(n, a.opts);
      if (Status st = prepare_kv_params(*loaded, &*p, threads); !st.is_ok())
        return fail(st.message());
      a.opts.base.quant.kvquant_calib = p->quant.kvquant_calib;
    }
  ThreadPool pool(threads);
  std::fprintf(stderr, "diagnose: %lld prompt tokens + %lld steps, variants %s, %d threads\n",
               (long long)a.opts.prefill, (long long)a.opts.gen, a.variants.c_str(), threads);
  ProgressBar bar("diagnose");
  std::vector<float> attention;
  auto r = eval::run_diagnose(
      *loaded->model, pool, tokens, a.opts, [&](int64_t d, int64_t t) { bar.update(d, t); },
      &attention);
  bar.finish();
  if (!r) return fail(r.error());
  nlohmann::json j = std::move(*r);
  j["config"]["model"] =
      std::filesystem::path(*resolve_model_path(a.model.model_path)).filename().string();
  j["config"]["text"] = a.file;
  const std::string json_path = a.out_dir + "/diagnostics.json";
  const std::string md_path = a.out_dir + "/diagnostics.md";
  if (Status s = write_file_atomic(json_path, j.dump() + "\n"); !s) return fail(s.message());
  const std::string npy_path = a.out_dir + "/fullkv_attention.npy";
  if (Status s = write_npy(npy_path, attention.data(), a.opts.gen, a.opts.prefill + a.opts.gen); !s)
    return fail(s.message());
  const std::string md = eval::diagnose_markdown(j);
  if (Status s = write_file_atomic(md_path, md); !s) return fail(s.message());
  std::printf("%s\n", md.c_str());
  std::fprintf(stderr,
               "wrote %s, %s and %s (FullKV attention per step, layer/head-averaged)\nplots: "
               "$(tools/eval/venv.sh) tools/diagnostics/plot_diagnostics.py "
               "%s\n",
               json_path.c_str(), md_path.c_str(), npy_path.c_str(), json_path.c_str());
  return 0;
}

}  // namespace

Runner add_diagnose(CLI::App& app) {
  auto a = std::make_shared<DiagnoseArgs>();
  add_model_options(app, a->model, MatmulMode::kF32);
  app.add_option("-f,--file", a->file, "text whose first --prefill tokens are the prompt")
      ->required();
  app.add_option("--prefill", a->opts.prefill, "prompt tokens")->capture_default_str();
  app.add_option("--gen", a->opts.gen, "decode steps (FullKV's greedy tokens)")
      ->capture_default_str();
  app.add_option("-b,--prefill-chunk", a->opts.chunk, "prompt tokens per forward call")
      ->capture_default_str();
  app.add_option("--variants", a->variants,
                 "comma-separated: R1 (ω=1, F+E), R2 (ω=8, F+E), R3 (QEvict, ω=8), R4 (ω=32), "
                 "or any --kv-policy name (its authors' defaults)")
      ->capture_default_str();
  app.add_option("--out-dir", a->out_dir, "where diagnostics.json and diagnostics.md go")
      ->capture_default_str();
  app.add_option("--map-layer", a->opts.map_layer,
                 "layer drawn in the tier map (default: R3's layer with the most tier moves)");
  a->kv.preset.budget_fraction = a->opts.budget;  // diagnose's default: 20 %
  add_kv_options(app, a->kv, KvFlagScope::kGrid);
  return [a] { return run_diagnose_cmd(*a); };
}

}  // namespace qevict::cli
