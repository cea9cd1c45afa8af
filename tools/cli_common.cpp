// See cli_common.h.
#include "cli_common.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "kvcache/head_cache.h"
#include "kvcache/tiered_cache.h"

namespace qevict::cli {

void add_model_options(CLI::App& app, ModelOptions& o) {
  app.add_option(
      "-m,--model", o.model_path,
      "GGUF model file (default: $QEVICT_MODEL, else the model fetched by tools/fetch_model.sh)");
  app.add_option("-t,--threads", o.threads, "threads to use (default: all cores)")
      ->check(CLI::NonNegativeNumber);
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

void add_kv_options(CLI::App& app, KvOptions& o) {
  KvCacheParams& p = o.params;
  app.add_option("--kv-policy", p.policy,
                 "KV cache: full, qevict (tiered F/Q/E), streaming (StreamingLLM: sink + recent) "
                 "or h2o (heavy hitters + recent, per head)")
      ->capture_default_str()
      ->check(CLI::IsMember({"full", "qevict", "streaming", "h2o"}));
  app.add_option("--kv-budget", p.budget_fraction,
                 "KV budget per layer as a fraction of the full cache for -c tokens")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--kv-budget-bytes", p.budget_bytes, "KV budget per layer in bytes")
      ->check(CLI::NonNegativeNumber);
  o.q = app.add_option("--kv-q", p.q,
                       "share of the history budget for the low-bit tier (0: two tiers F+E; "
                       "streaming default 0)")
            ->capture_default_str();
  o.window = app.add_option("--kv-window", p.window, "tokens per window (ω; streaming default 1)")
                 ->capture_default_str();
  o.route_every = app.add_option("--kv-route-every", p.route_every,
                                 "decode steps between routing events (Ω; streaming/h2o default 1)")
                      ->capture_default_str();
  o.sink = app.add_option("--kv-sink", p.sink,
                          "sink tokens kept in full precision (streaming default 4, h2o 0)")
               ->capture_default_str();
  o.local = app.add_option("--kv-local", p.local,
                           "newest tokens kept in full precision (h2o default: half the budget)")
                ->capture_default_str();
  o.bits = app.add_option("--kv-bits", p.bits, "low-bit tier: 2 or 4 bits")->capture_default_str();
  app.add_option("--kv-group", p.value_group, "value quantization group (0: head_dim)")
      ->capture_default_str();
  app.add_option("--kv-dtype", o.dtype, "full-precision KV type")
      ->capture_default_str()
      ->check(CLI::IsMember({"f16", "bf16"}));
  app.add_option("--kv-score", p.score,
                 "window ranking: sum (cumulative attention, the paper's) or age (mean per step "
                 "since the window was written)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sum", "age"}));
  app.add_flag("--kv-strict-ledger", p.strict_ledger,
               "charge ledger copies held by promoted windows to the budget");
  app.add_flag("--kv-stats", o.stats, "print KV cache statistics at the end");
  app.add_option("--kv-trace", p.trace_path,
                 "write one JSON line per routing event and layer to this file");
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
  QEVICT_RETURN_IF_ERROR(apply_policy_defaults(&p, g));
  QEVICT_RETURN_IF_ERROR(p.validate());
  return p;
}

void print_kv_stats(const SequenceKvCache& cache, double decode_seconds) {
  const auto* t = dynamic_cast<const TieredKvCache*>(&cache);
  std::fprintf(stderr, "kv-stats: %s\n", cache.describe().c_str());
  std::fprintf(stderr, "kv-stats: bytes held by the cache: %.2f MiB\n",
               cache.bytes_held() / 1048576.0);
  if (const auto* h = dynamic_cast<const HeadKvCache*>(&cache)) {
    size_t worst = 0;
    for (int l = 0; l < h->n_layers(); ++l) worst = std::max(worst, h->bytes_in_use(l));
    std::fprintf(stderr,
                 "kv-stats: per-head tokens: capacity %lld (heavy %lld) | routing events %lld | "
                 "tokens evicted %lld (all layers and heads) | bytes in use %zu of a budget of "
                 "%zu B/layer (worst layer)\n",
                 (long long)h->head_capacity(), (long long)h->heavy_capacity(),
                 (long long)h->routing_events(), (long long)h->evictions(), worst,
                 h->budget_bytes());
  }
  if (!t) return;
  const TierStats s = t->stats();
  std::fprintf(stderr,
               "kv-stats: %-5s %6s %6s %6s %6s | %6s %6s %6s %6s | %10s %10s %10s %10s %10s\n",
               "layer", "F", "Q", "E", "local", "promo", "demo", "evict", "quant", "sink B", "F B",
               "Q B", "ledger@F B", "alloc B");
  TierLayerStats tot;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const auto& x = s.layers[l];
    std::fprintf(stderr,
                 "kv-stats: %5zu %6lld %6lld %6lld %6lld | %6lld %6lld %6lld %6lld | %10zu %10zu "
                 "%10zu %10zu %10zu\n",
                 l, (long long)x.windows_full, (long long)x.windows_quant,
                 (long long)x.windows_evicted, (long long)x.windows_local, (long long)x.promotions,
                 (long long)x.demotions, (long long)x.evictions, (long long)x.quantizations,
                 x.bytes_sink, x.bytes_full, x.bytes_quant, x.bytes_ledger_of_full,
                 x.bytes_allocated);
    tot.windows_full += x.windows_full;
    tot.windows_quant += x.windows_quant;
    tot.windows_evicted += x.windows_evicted;
    tot.windows_local += x.windows_local;
    tot.promotions += x.promotions;
    tot.demotions += x.demotions;
    tot.evictions += x.evictions;
    tot.quantizations += x.quantizations;
    tot.bytes_sink += x.bytes_sink;
    tot.bytes_full += x.bytes_full;
    tot.bytes_quant += x.bytes_quant;
    tot.bytes_ledger_of_full += x.bytes_ledger_of_full;
    tot.bytes_allocated += x.bytes_allocated;
    tot.aged += x.aged;
    tot.evicted_at_first_routing += x.evicted_at_first_routing;
  }
  std::fprintf(stderr,
               "kv-stats: %5s %6lld %6lld %6lld %6lld | %6lld %6lld %6lld %6lld | %10zu %10zu "
               "%10zu %10zu %10zu\n",
               "total", (long long)tot.windows_full, (long long)tot.windows_quant,
               (long long)tot.windows_evicted, (long long)tot.windows_local,
               (long long)tot.promotions, (long long)tot.demotions, (long long)tot.evictions,
               (long long)tot.quantizations, tot.bytes_sink, tot.bytes_full, tot.bytes_quant,
               tot.bytes_ledger_of_full, tot.bytes_allocated);
  std::fprintf(stderr,
               "kv-stats: budget %zu B/layer (K_f %lld x M_f %zu B, K_q %lld x M_q %zu B) | "
               "routing events %lld | "
               "young windows evicted at first routing: %lld of %lld (%.1f%%)\n",
               s.budget_bytes_per_layer, (long long)s.capacity_full, s.window_full_bytes,
               (long long)s.capacity_quant, s.window_quant_bytes, (long long)s.routing_events,
               (long long)tot.evicted_at_first_routing, (long long)tot.aged,
               tot.aged ? 100.0 * tot.evicted_at_first_routing / tot.aged : 0.0);
  std::fprintf(stderr,
               "kv-stats: time routing %.3f s in all (quantizing %.3f s, promoting %.3f s); during "
               "decode %.3f s%s\n",
               s.route_seconds, s.quantize_seconds, s.promote_seconds, s.route_seconds_decode,
               decode_seconds > 0 ? fmt::format(" = {:.2f}% of decode time",
                                                100.0 * s.route_seconds_decode / decode_seconds)
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
