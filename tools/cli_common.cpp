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
#include <random>
#include <sstream>
#include <thread>

#include "engine/session_file.h"
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

void add_sampling_options(CLI::App& app, SamplingParams& s, int64_t& seed) {
  app.add_option("--temp", s.temperature, "temperature (0 = greedy)")->capture_default_str();
  app.add_option("--top-k", s.top_k, "top-k (0 = off)")->capture_default_str();
  app.add_option("--top-p", s.top_p, "top-p (1 = off)")->capture_default_str();
  app.add_option("--min-p", s.min_p, "min-p (0 = off)")->capture_default_str();
  app.add_option("-s,--seed", seed, "RNG seed (-1 = random)")->capture_default_str();
}

uint64_t resolve_seed(int64_t flag_value) {
  return flag_value >= 0 ? uint64_t(flag_value) : std::random_device{}();
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
  const bool cache = scope == KvFlagScope::kCache;
  for (const KvOptionInfo& row : kv_options()) {
    if (row.per_cache && !cache) continue;
    const std::string key = row.key;
    std::string help = row.key == "policy" ? kv_policy_help() : row.help;
    if (row.flag_only) {
      app.add_flag_callback(
          row.flag, [&o, key] { o.list.emplace_back(key, "1"); }, help);
      continue;
    }
    const std::string def = row.get(o.preset);
    if (!def.empty() && def != "0" && row.key != "trace" && row.key != "policy")
      help += " [default: " + def + "]";
    app.add_option_function<std::string>(
           row.flag, [&o, key](const std::string& v) { o.list.emplace_back(key, v); }, help)
        ->type_name(row.value);
  }
  if (!cache) return;
  app.add_flag("--kv-stats", o.stats, "print KV cache statistics at the end");
}

Expected<KvCacheParams> kv_flags(const KvOptions& o, KvParamsGiven* given) {
  KvCacheParams p = o.preset;
  for (const auto& [k, v] : o.list) {
    if (Status st = set_kv_option(&p, given, k, v); !st) {
      const KvOptionInfo* row = find_kv_option(k);
      return Status::error(fmt::format("{}: {}", row ? row->flag : k, st.message()));
    }
  }
  return p;
}

bool attach_known_calibration(const Loaded& l, KvCacheParams* p) {
  const PolicyInfo* row = find_policy(p->policy);
  if (!row || !row->needs_calibration || p->quant.kvquant_calib) return true;
  for (const auto& [k, cal] : l.kvquant)
    if (k == std::tuple<int, double, int>{p->quant.bits, 1.0 - p->quant.outlier_share,
                                          p->quant.f16_first}) {
      p->quant.kvquant_calib = cal;
      return true;
    }
  return false;
}

Status prepare_kv_params(Loaded& l, KvCacheParams* p, int threads) {
  if (attach_known_calibration(l, p)) return Status::ok();
  KvQuantConfig c;
  c.bits = p->quant.bits;
  c.sparsity = 1.0 - p->quant.outlier_share;
  c.first_fp16 = p->quant.f16_first;
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
  p->quant.kvquant_calib = *cal;
  return Status::ok();
}

Expected<KvCacheParams> kv_params(const KvOptions& o) {
  KvParamsGiven g;
  auto p = kv_flags(o, &g);
  if (!p) return p.status();
  QEVICT_RETURN_IF_ERROR(finish_kv_params(&*p, g));
  return p;
}

void print_kv_stats(const SequenceKvCache& cache, double decode_seconds) {
  KvReport r;
  cache.report(&r);
  std::fprintf(stderr, "kv-stats: %s\n", r.describe.c_str());
  // A fraction below the fixed regions (a short context): the budget is their minimum.
  if (r.budget.floored) std::fprintf(stderr, "kv-stats: %s\n", r.budget.floor_note().c_str());
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
  if (!r.prompt_focus.empty())  // where the prompt-end window looked (--kv-adapt's statistic)
    std::fprintf(stderr,
                 "kv-stats: prompt focus %.4f nats (mean over layers of KL(the "
                 "prompt-end window's attention || the prompt's own) over the history)%s%s\n",
                 focus_score(r.prompt_focus),
                 r.adapted.empty() ? "" : "; low-bit tier: ", r.adapted.c_str());
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
  // The "quant" column: windows quantized (tiered cache), or a quantizer's units at low bits
  // (KIVI key groups, ZipCache tokens per head); KVQuant's exact outliers on a line of their own.
  const bool quantizer = r.budget.kind == CacheKind::kQuantized;
  auto row = [quantizer](const char* name, const KvLayerReport& x) {
    std::fprintf(stderr,
                 "kv-stats: %5s %6lld %6lld %6lld %6lld | %6lld %6lld %6lld %6lld | %10zu %10zu "
                 "%10zu %10zu %10zu\n",
                 name, (long long)x.windows_full, (long long)x.windows_quant,
                 (long long)x.windows_evicted, (long long)x.windows_local, (long long)x.promotions,
                 (long long)x.demotions, (long long)x.evictions,
                 (long long)(quantizer ? x.quantized_units : x.quantizations), x.bytes_sink,
                 x.bytes_full, x.bytes_quant, x.bytes_ledger_of_full, x.bytes_allocated);
  };
  for (size_t l = 0; l < r.layers.size(); ++l) row(std::to_string(l).c_str(), r.layers[l]);
  row("total", tot);
  if (tot.outliers > 0)
    std::fprintf(stderr, "kv-stats: outlier values kept exactly: %lld\n", (long long)tot.outliers);
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

SessionOptions session_options(const KvCacheParams& kv, int64_t n_ctx, int prefill_chunk) {
  SessionOptions o;
  o.kv = kv;
  o.n_ctx = n_ctx;
  o.prefill_chunk = prefill_chunk;
  return o;
}

// Why a session file cannot be resumed with these options (empty: it can): the first KV
// option, or the context size, that differs.
static std::string session_mismatch(const SessionFileContents& f, const SessionOptions& o) {
  for (const KvOptionInfo& row : kv_options()) {
    if (row.key == "trace") continue;  // where a trace goes is not the cache's state
    const std::string saved = row.get(f.kv), now = row.get(o.kv);
    if (saved != now) return fmt::format("{} {} (these flags: {})", row.flag, saved, now);
  }
  if (f.n_ctx != o.n_ctx) return fmt::format("-c {} (these flags: {})", f.n_ctx, o.n_ctx);
  return "";
}

Expected<std::unique_ptr<Session>> load_session(Model& model, const std::string& path,
                                                ThreadPool& pool, const SessionOptions* same_as,
                                                bool* restored) {
  // Session::load's reading and messages, with the options checked in between.
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error(fmt::format("cannot open session file '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Status::error(fmt::format("cannot read session file '{}'", path));
  const std::string bytes = ss.str();
  if (same_as) {
    auto f = decode_session(bytes);
    if (!f) return Status::error(fmt::format("{}: {}", path, f.error()));
    if (const std::string why = session_mismatch(*f, *same_as); !why.empty())
      return Status::error(fmt::format(
          "{} was saved with other options: {}; give the same options or another file", path, why));
  }
  auto s = Session::deserialize(model, bytes, pool, restored);
  if (!s) return Status::error(fmt::format("{}: {}", path, s.error()));
  return s;
}

std::vector<int32_t> eog_tokens(const Tokenizer& tok) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < tok.n_vocab(); ++id)
    if (tok.is_eog(id)) ids.push_back(id);
  return ids;
}

void TokenText::put(int32_t id) {
  if (tok_.is_eog(id)) return;
  const std::string piece = utf8_.push(tok_.token_to_piece(id));
  std::fwrite(piece.data(), 1, piece.size(), stdout);
  std::fflush(stdout);
}

void TokenText::end() {
  const std::string rest = utf8_.flush();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
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
