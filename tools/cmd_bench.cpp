// qevict bench: prefill and decode speed at given context depths, llama-bench style.
// For each depth P: an empty cache, P prompt tokens in chunks of -b (prefill tok/s), then
// -n greedy decode steps on top of them (decode tok/s at depth P). Repeated -r times;
// medians are reported. Prompt tokens come from a text file (-f) repeated as needed.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli_common.h"
#include "commands.h"
#include "engine/prompt_drive.h"
#include "engine/sampling.h"
#include "kernels/matmul.h"

namespace qevict::cli {

namespace {

struct BenchArgs {
  ModelOptions model;
  std::string depths = "512,4096";
  std::string file;
  int n_decode = 64;
  int batch = 512;
  int reps = 3;
  bool json = false;
  KvOptions kv;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty()
             ? 0.0
             : (v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]));
}

int run_bench(const BenchArgs& a) {
  // Flags are checked before the model loads: a bad value fails fast.
  auto kvp = kv_params(a.kv);
  if (!kvp) return fail(kvp.error());
  std::vector<int64_t> depths;
  {
    std::stringstream ss(a.depths);
    std::string item;
    while (std::getline(ss, item, ',')) {
      try {
        depths.push_back(std::stoll(item));
      } catch (...) {
        return fail("bad depth list '" + a.depths + "' (want e.g. 512,4096)");
      }
      if (depths.back() <= 0) return fail("depths must be positive");
    }
  }
  auto loaded = load_model(a.model);
  if (!loaded) return fail(loaded.error());
  Model& model = *loaded->model;
  std::vector<int32_t> src;
  if (!a.file.empty()) {
    auto text = read_prompt("", a.file);
    if (!text) return fail(text.error());
    src = loaded->tokenizer->encode(*text, false, false);
  }
  if (src.empty())
    src = loaded->tokenizer->encode("The quick brown fox jumps over the lazy dog. ", false, false);
  const int threads = resolve_threads(a.model.threads);
  if (Status st = prepare_kv_params(*loaded, &*kvp, threads); !st.is_ok())
    return fail(st.message());
  ThreadPool pool(threads);
  const int32_t V = model.config().n_vocab;
  nlohmann::json results = nlohmann::json::array();
  std::vector<float> logits(static_cast<size_t>(V));
  for (int64_t P : depths) {
    std::vector<int32_t> prompt(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) prompt[size_t(i)] = src[size_t(i) % src.size()];
    std::vector<double> pp, tg;
    size_t kv_bytes = 0;
    double route_share = 0.0, last_decode_s = 0.0;
    std::unique_ptr<SequenceKvCache> last;
    for (int r = 0; r < a.reps; ++r) {
      auto cache_or = make_kv_cache(model.kv_shape(), P + a.n_decode, *kvp);
      if (!cache_or) return fail(cache_or.error());
      last = std::move(*cache_or);
      SequenceKvCache& cache = *last;
      double route_before = 0.0;
      auto t0 = std::chrono::steady_clock::now();
      // --prefill-route end compresses once the prompt is in: part of the prefill's time.
      if (Status s = prefill_prompts(model, {{&cache, prompt.data(), P, logits.data()}}, a.batch,
                                     pool, true);
          !s)
        return fail(s.message());
      auto t1 = std::chrono::steady_clock::now();
      KvReport rep;
      cache.report(&rep);
      route_before = rep.route_seconds;
      for (int j = 0; j < a.n_decode; ++j) {
        int32_t tok = argmax(logits.data(), V);
        std::vector<BatchSegment> segs{{&cache, &tok, 1, false, logits.data()}};
        Status s = model.forward(segs, pool);
        if (!s) return fail(s.message());
      }
      auto t2 = std::chrono::steady_clock::now();
      pp.push_back(double(P) / std::chrono::duration<double>(t1 - t0).count());
      tg.push_back(double(a.n_decode) / std::chrono::duration<double>(t2 - t1).count());
      kv_bytes = cache.bytes_held();
      last_decode_s = std::chrono::duration<double>(t2 - t1).count();
      cache.report(&rep);
      route_share = (rep.route_seconds - route_before) / last_decode_s;
    }
    const double mpp = median(pp), mtg = median(tg);
    results.push_back({{"engine", "qevict"},
                       {"kv_policy", kvp->policy},
                       {"kv_budget", kvp->budget_fraction},
                       {"depth", P},
                       {"n_decode", a.n_decode},
                       {"threads", threads},
                       {"matmul", matmul_q8_enabled() ? "q8" : "f32"},
                       {"amx_prefill", matmul_amx_enabled()},
                       {"prefill_tok_s", mpp},
                       {"decode_tok_s", mtg},
                       {"prefill_runs", pp},
                       {"decode_runs", tg},
                       {"kv_bytes", kv_bytes},
                       {"routing_share_of_decode", route_share}});
    if (!a.json)
      std::printf(
          "depth %6lld | prefill %8.1f tok/s | decode %6.1f tok/s (median of %d) | kv %.1f MiB | "
          "routing %.2f%% of decode\n",
          (long long)P, mpp, mtg, a.reps, kv_bytes / 1048576.0, 100.0 * route_share);
    if (a.kv.stats && last) print_kv_stats(*last, last_decode_s);
  }
  if (a.json) std::printf("%s\n", results.dump(1).c_str());
  return 0;
}

}  // namespace

Runner add_bench(CLI::App& app) {
  auto a = std::make_shared<BenchArgs>();
  add_model_options(app, a->model);
  app.add_option("-d,--depths", a->depths, "comma-separated context depths")->capture_default_str();
  app.add_option("-f,--file", a->file, "text whose tokens fill the context (repeated as needed)")
      ->check(CLI::ExistingFile);
  app.add_option("-n,--n-decode", a->n_decode, "decode steps after the prefill")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-b,--batch", a->batch, "prefill chunk")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-r,--reps", a->reps, "repetitions (medians reported)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--json", a->json, "JSON output");
  add_kv_options(app, a->kv);
  return [a] { return run_bench(*a); };
}

}  // namespace qevict::cli
