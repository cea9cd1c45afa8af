// See cli_common.h.
#include "cli_common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "kernels/lowbit.h"
#include "kernels/matmul.h"
#include "kvcache/registry.h"

namespace qevict::cli {

void add_model_options(CLI::App& app, ModelOptions& o, MatmulMode default_mode) {
  app.add_option(
      "-m,--model", o.model_path,
      "GGUF model file (default: $QEVICT_MODEL, else the model fetched by tools/fetch_model.sh)");
  app.add_option("-t,--threads", o.threads, "threads to use (default: all cores)")
      ->check(CLI::NonNegativeNumber);
  o.matmul = default_mode == MatmulMode::kQ8 ? "q8" : "f32";
  app.add_option("--matmul", o.matmul,
                 "decode-sized matmuls (< 32 tokens a call): q8 rounds activations to 8 bits per "
                 "32-block with integer dot products, as llama.cpp (faster; needs AVX-512 VNNI, "
                 "else f32), f32 multiplies exactly; QEVICT_Q8=0 forces f32")
      ->check(CLI::IsMember({"q8", "f32"}))
      ->capture_default_str();
  app.add_option("--amx", o.amx,
                 "prefill matmuls (>= 32 tokens a call) on AMX-BF16 tiles where the CPU has them "
                 "(split-bf16 products, as llama.cpp); off multiplies exactly in f32, and a "
                 "token's logits then do not depend on its batch; auto: on unless QEVICT_AMX=0")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("--pv-int8", o.pv_int8,
                 "decode's P·V over INT2-value windows with 8-bit weights and integer dot "
                 "products (AVX-512 VNNI + VBMI); off keeps the float path; auto: on unless "
                 "QEVICT_PV_INT8=0")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
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
  return Status::error(
      fmt::format("no model given and the default model is not at {}: pass -m PATH, set "
                  "QEVICT_MODEL, or run tools/fetch_model.sh",
                  def));
}

int resolve_threads(int flag_value) {
  if (flag_value > 0) return flag_value;
  const unsigned hc = std::thread::hardware_concurrency();
  return hc ? static_cast<int>(hc) : 1;
}

Expected<Loaded> load_model(const ModelOptions& o) {
  if (o.matmul == "f32") matmul_set_q8(false);
  // auto leaves what the environment said (qevict_main.cpp: apply_env_kernel_switches).
  if (o.amx != "auto") matmul_set_amx(o.amx == "on");
  if (o.pv_int8 != "auto") set_qwin_pv_i8_enabled(o.pv_int8 == "on");
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
  if (!text.empty() && !file.empty())
    return Status::error("give either -p TEXT or -f FILE, not both");
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

void add_kv_options(CLI::App& app, KvOptions& o, KvFlagScope scope) {
  KvCacheParams& p = o.params;
  const bool cache = scope == KvFlagScope::kCache;
  if (cache) {
    std::string help = "KV cache policy:";
    std::vector<std::string> names;
    for (const auto& r : policy_registry()) {
      help += "\n  " + r.name + ": " + r.summary;
      names.push_back(r.name);
    }
    app.add_option("--kv-policy", p.policy, help)
        ->capture_default_str()
        ->check(CLI::IsMember(names));
  }
  auto* budget = app.add_option("--kv-budget", p.budget_fraction,
                                cache ? "KV budget per layer as a fraction of the full cache for "
                                        "-c tokens"
                                      : "budget per layer, a fraction of the full cache for "
                                        "prefill + gen tokens (every variant)")
                     ->check(CLI::Range(0.0, 1e6));
  if (!cache) budget->capture_default_str();
  app.add_option("--kv-budget-bytes", p.budget_bytes, "KV budget per layer in bytes")
      ->check(CLI::NonNegativeNumber);
  o.q = app.add_option(
               "--kv-q", p.q,
               "share of the history budget for the low-bit tier (0: two tiers F+E; "
               "streaming default 0; zipcache: the share of tokens at low bits, 0.4; kvquant: the "
               "outlier share, 0.01)")
            ->capture_default_str();
  if (cache)
    o.window = app.add_option("--kv-window", p.window, "tokens per window (ω; streaming default 1)")
                   ->capture_default_str();
  o.route_every =
      app.add_option("--kv-route-every", p.route_every,
                     "decode steps between routing events (Ω; streaming/h2o default 1; zipcache: "
                     "tokens between requantizations, default 100)")
          ->capture_default_str();
  o.sink = app.add_option("--kv-sink", p.sink,
                          "sink tokens kept in full precision (streaming default 4, h2o 0)")
               ->capture_default_str();
  o.local = app.add_option(
                   "--kv-local", p.local,
                   "newest tokens kept in full precision (h2o default: half the budget; kivi: the "
                   "f16 residual R, default 128)")
                ->capture_default_str();
  o.bits =
      app.add_option("--kv-bits", p.bits,
                     "low-bit tier: 2 or 4 bits, or auto. Unset: qevict keys 4 and values 2 "
                     "(--kv-value-bits), streaming 2, zipcache 2 for the unimportant tokens (the "
                     "rest 4), kvquant 3 (2-4). auto: 4 when the budget holds every window of the "
                     "context at 4 bits, else 2")
          ->transform(CLI::Transformer(std::map<std::string, int>{{"auto", 0}}));
  o.value_bits = app.add_option("--kv-value-bits", p.value_bits,
                                "qevict/streaming: the low-bit tier's values at 2 or 4 bits, its "
                                "keys at --kv-bits (0: as --kv-bits)")
                     ->capture_default_str();
  app.add_option("--kv-group", p.value_group,
                 "value quantization group (0: head_dim; kivi: G, default 32)")
      ->capture_default_str();
  app.add_option("--kv-dtype", o.dtype, "full-precision KV type")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "bf16"}));
  app.add_option("--kv-score", p.score,
                 "window ranking: sum (cumulative attention, the paper's) or age (mean per step "
                 "since the window was written)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sum", "age"}));
  o.pool =
      app.add_option("--kv-pool", p.pool,
                     "qevict: rank each window by the highest score within this many windows "
                     "either side (SnapKV's pooling, per window; keeps the rest of a value that "
                     "spans windows); 0: its own score. Default 2 with --prefill-route end and "
                     "a prefill window (chosen from the eval suite, EVALUATION.md), else 0")
          ->check(CLI::Range(0, 64));
  app.add_option("--kv-pool-side", p.pool_side,
                 "qevict pooling: both (the windows either side of a peak rise with it) or "
                 "after (only the windows that follow it: the rest of a value the question "
                 "found)")
      ->capture_default_str()
      ->check(CLI::IsMember({"both", "after"}));
  app.add_flag("--kv-strict-ledger", p.strict_ledger,
               "charge ledger copies held by promoted windows to the budget");
  o.prefill_route =
      app.add_option(
             "--prefill-route", p.prefill_route,
             "when budgeted caches route the prompt: chunk (after every prefill chunk; peak "
             "memory = budget + one chunk) or end (hold the whole prompt in full precision, "
             "route once when it is in; the paper's code; peak memory = the prompt). Default "
             "end (for qevict chosen from the eval suite, EVALUATION.md; the SnapKV family, "
             "kivi and zipcache compress the prompt once in their references), but chunk for "
             "streaming, h2o and kvquant")
          ->check(CLI::IsMember({"chunk", "end"}));
  o.prefill_window =
      app.add_option("--prefill-window", p.prefill_window,
                     "with --prefill-route end on windowed caches: 0 ranks the prompt by the "
                     "cumulative attention of all its queries (Eq. 1); N > 0 by the last N queries "
                     "only (SnapKV's observation window, w = 32 in its code). Default 32 for "
                     "qevict (chosen from the eval suite, EVALUATION.md), else 0")
          ->check(CLI::Range(0, 4096));
  if (!cache) return;
  app.add_flag("--kv-stats", o.stats, "print KV cache statistics at the end");
  app.add_option("--kv-trace", p.trace_path,
                 "write one JSON line per routing event and layer to this file (kivi: a "
                 "directory, where the prompt's quantization is dumped as .npy; kvquant: the "
                 "same, with the calibration's activations)");
}

bool attach_known_calibration(const Loaded& l, KvCacheParams* p) {
  if (p->policy != "kvquant" || p->kvquant_calib) return true;
  for (const auto& [k, cal] : l.kvquant)
    if (k == std::tuple<int, double, int>{p->bits, 1.0 - p->q, p->sink}) {
      p->kvquant_calib = cal;
      return true;
    }
  return false;
}

Status prepare_kv_params(Loaded& l, KvCacheParams* p, int threads) {
  if (attach_known_calibration(l, p)) return Status::ok();
  KvQuantConfig c;
  c.bits = p->bits;
  c.sparsity = 1.0 - p->q;
  c.first_fp16 = p->sink;
  const std::tuple<int, double, int> key{c.bits, c.sparsity, c.first_fp16};
  std::vector<int32_t> tokens = l.tokenizer->encode(std::string(kvquant_calibration_text()),
                                                    /*add_special=*/true, /*parse_special=*/false);
  if (tokens.size() > 2048) tokens.resize(2048);
  const auto t0 = std::chrono::steady_clock::now();
  ThreadPool pool(resolve_threads(threads));
  // --kv-trace DIR: the calibration's activations are dumped there too (kvquant_numpy.py).
  auto cal = kvquant_calibration(*l.model, tokens, c, pool, p->trace_path);
  if (!cal) return cal.status();
  std::fprintf(stderr,
               "kvquant: calibrated %d-bit levels and key thresholds on %zu tokens (%.1f s)\n",
               c.bits, tokens.size(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  l.kvquant.push_back({key, *cal});
  p->kvquant_calib = *cal;
  return Status::ok();
}

Expected<KvCacheParams> kv_params(const KvOptions& o) {
  KvCacheParams p = o.params;
  p.dtype = o.dtype == "bf16" ? HalfType::kBF16 : HalfType::kF16;
  auto given = [](const CLI::Option* opt) { return opt != nullptr && opt->count() > 0; };
  KvParamsGiven g;
  g.window = given(o.window);
  g.route_every = given(o.route_every);
  g.sink = given(o.sink);
  g.local = given(o.local);
  g.q = given(o.q);
  g.bits = given(o.bits);
  g.prefill_route = given(o.prefill_route);
  g.prefill_window = given(o.prefill_window);
  g.pool = given(o.pool);
  g.value_bits = given(o.value_bits);
  QEVICT_RETURN_IF_ERROR(apply_policy_defaults(&p, g));
  QEVICT_RETURN_IF_ERROR(p.validate());
  return p;
}

void print_kv_stats(const SequenceKvCache& cache, double decode_seconds) {
  KvReport r;
  cache.report(&r);
  std::fprintf(stderr, "kv-stats: %s\n", r.describe.c_str());
  const KvLayerReport tot = r.total();
  std::fprintf(stderr, "kv-stats: bytes held by the cache: %.2f MiB (peak %.2f MiB)",
               r.bytes_held / 1048576.0, std::max(r.peak_bytes_held, r.bytes_held) / 1048576.0);
  if (r.budget.budgeted()) {
    std::fprintf(stderr, " | budgeted bytes in use %zu of a budget of %zu B/layer (worst layer)",
                 tot.bytes_budgeted, r.budget.total);
    // Held against the whole budget (all layers): what SPEC §3 bounds; ledger copies of
    // promoted windows are outside the budget unless --kv-strict-ledger.
    const double all = double(r.budget.total) * double(r.layers.size());
    std::fprintf(stderr, " | held = %.3f x budget of %zu layers (ledger copies in F %.2f MiB)",
                 all > 0 ? double(r.bytes_held) / all : 0.0, r.layers.size(),
                 tot.bytes_ledger_of_full / 1048576.0);
  }
  std::fprintf(stderr, "\n");
  if (r.budget.kind == CacheKind::kQuantized) {
    // A quantizer's byte point: codes + scales + f16 residuals (no scratch), against FullKV's
    // f16 bytes for the same tokens.
    const int64_t n = cache.n_past();
    const double full = double(n) * double(r.budget.token_bytes) * double(r.layers.size());
    std::fprintf(stderr,
                 "kv-stats: quantized %zu B + f16 residual %zu B = %zu B stored over %zu layers "
                 "for %lld tokens = %.4f x FullKV's f16 bytes\n",
                 tot.bytes_quant, tot.bytes_full, tot.bytes_quant + tot.bytes_full, r.layers.size(),
                 (long long)n, full > 0 ? double(tot.bytes_quant + tot.bytes_full) / full : 0.0);
  }
  if (r.budget.kind == CacheKind::kPerHead) {
    std::fprintf(stderr,
                 "kv-stats: per-head tokens: capacity %lld (heavy %lld) | routing events %lld | "
                 "tokens evicted %lld (all layers and heads)\n",
                 (long long)r.budget.head_capacity, (long long)r.budget.head_heavy,
                 (long long)r.routing_events, (long long)tot.evictions);
  }
  if (r.budget.kind != CacheKind::kWindowed) return;
  std::fprintf(stderr,
               "kv-stats: %-5s %6s %6s %6s %6s | %6s %6s %6s %6s | %10s %10s %10s %10s %10s\n",
               "layer", "F", "Q", "E", "local", "promo", "demo", "evict", "quant", "sink B", "F B",
               "Q B", "ledger@F B", "alloc B");
  auto row = [](const char* name, const KvLayerReport& x) {
    std::fprintf(stderr,
                 "kv-stats: %5s %6lld %6lld %6lld %6lld | %6lld %6lld %6lld %6lld | %10zu %10zu "
                 "%10zu %10zu %10zu\n",
                 name, (long long)x.windows_full, (long long)x.windows_quant,
                 (long long)x.windows_evicted, (long long)x.windows_local, (long long)x.promotions,
                 (long long)x.demotions, (long long)x.evictions, (long long)x.quantizations,
                 x.bytes_sink, x.bytes_full, x.bytes_quant, x.bytes_ledger_of_full,
                 x.bytes_allocated);
  };
  for (size_t l = 0; l < r.layers.size(); ++l) row(std::to_string(l).c_str(), r.layers[l]);
  row("total", tot);
  std::fprintf(stderr,
               "kv-stats: budget %zu B/layer (K_f %lld x M_f %zu B, K_q %lld x M_q %zu B) | "
               "routing events %lld | "
               "young windows evicted at first routing: %lld of %lld (%.1f%%)\n",
               r.budget.total, (long long)r.budget.capacity_full, r.budget.window_full,
               (long long)r.budget.capacity_quant, r.budget.window_quant,
               (long long)r.routing_events, (long long)tot.evicted_at_first_routing,
               (long long)tot.aged,
               tot.aged ? 100.0 * tot.evicted_at_first_routing / tot.aged : 0.0);
  std::fprintf(stderr,
               "kv-stats: time routing %.3f s in all (quantizing %.3f s, promoting %.3f s); during "
               "decode %.3f s%s\n",
               r.route_seconds, r.quantize_seconds, r.promote_seconds, r.route_seconds_decode,
               decode_seconds > 0 ? fmt::format(" = {:.2f}% of decode time",
                                                100.0 * r.route_seconds_decode / decode_seconds)
                                        .c_str()
                                  : "");
}

static double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ProgressBar::ProgressBar(std::string label)
    : label_(std::move(label)), tty_(isatty(fileno(stderr)) != 0), t0_(now_seconds()) {}

void ProgressBar::update(int64_t done, int64_t total) {
  if (total <= 0) return;
  const int pct = int(100 * done / total);
  if (pct == last_ || (!tty_ && pct / 10 == last_ / 10 && pct != 100)) return;
  last_ = pct;
  const double el = now_seconds() - t0_;
  const double left = done > 0 ? el * double(total - done) / double(done) : 0.0;
  constexpr int kWidth = 30;
  std::string bar(size_t(kWidth * pct / 100), '#');
  bar.resize(kWidth, ' ');
  std::fprintf(stderr, "%s%s [%s] %3d%% %lld/%lld  %.0f s elapsed, ~%.0f s left%s",
               tty_ ? "\r" : "", label_.c_str(), bar.c_str(), pct, (long long)done,
               (long long)total, el, left, tty_ ? "" : "\n");
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (tty_ && last_ >= 0) std::fprintf(stderr, "\n");
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "error: %s\n", msg.c_str());
  return 1;
}

}  // namespace qevict::cli
