// The KV option table and set_kv_option (see options.h).
#include "kvcache/options.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "kvcache/registry.h"

namespace qevict {

namespace {

Status parse_int(const std::string& key, const std::string& v, int64_t* out) {
  try {
    size_t used = 0;
    *out = std::stoll(v, &used);
    if (used != v.size()) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    return Status::error(fmt::format("{}: '{}' is not an integer", key, v));
  }
  return Status::ok();
}

Status parse_double(const std::string& key, const std::string& v, double* out) {
  try {
    size_t used = 0;
    *out = std::stod(v, &used);
    if (used != v.size() || std::isnan(*out)) throw std::invalid_argument(v);
  } catch (const std::exception&) {
    return Status::error(fmt::format("{}: '{}' is not a number", key, v));
  }
  return Status::ok();
}

Status parse_bool(const std::string& key, const std::string& v, bool* out) {
  if (v == "1" || v == "true" || v == "on" || v.empty()) return *out = true, Status::ok();
  if (v == "0" || v == "false" || v == "off") return *out = false, Status::ok();
  return Status::error(fmt::format("{}: '{}' is not true or false", key, v));
}

// A row without its parser (set, get): the caller adds them.
KvOptionInfo row(std::string key, std::string flag, std::string value, std::string help,
                 bool per_cache = false, bool flag_only = false) {
  KvOptionInfo o;
  o.key = std::move(key);
  o.flag = std::move(flag);
  o.value = std::move(value);
  o.help = std::move(help);
  o.per_cache = per_cache;
  o.flag_only = flag_only;
  return o;
}

// A row for an int field, marking `mark` (may be null).
KvOptionInfo int_row(std::string key, std::string flag, std::string help, int KvCacheParams::*f,
                     bool KvParamsGiven::*mark, bool per_cache = false, std::string alias = "") {
  KvOptionInfo o{std::move(key), std::move(flag), std::move(alias), "N",    std::move(help),
                 per_cache,      false,           nullptr,          nullptr};
  o.set = [f, mark, k = o.key](KvCacheParams* p, KvParamsGiven* g, const std::string& v) {
    int64_t x = 0;
    QEVICT_RETURN_IF_ERROR(parse_int(k, v, &x));
    if (x < INT32_MIN || x > INT32_MAX)
      return Status::error(fmt::format("{}: {} is out of range", k, v));
    p->*f = int(x);
    if (mark) g->*mark = true;
    return Status::ok();
  };
  o.get = [f](const KvCacheParams& p) { return std::to_string(p.*f); };
  return o;
}

// A row for an enum field with its names.
template <typename E>
KvOptionInfo enum_row(std::string key, std::string flag, std::string help, E KvCacheParams::*f,
                      std::vector<std::pair<std::string, E>> names, bool KvParamsGiven::*mark,
                      std::string alias = "") {
  std::string value;
  for (const auto& [n, e] : names) value += (value.empty() ? "" : "|") + n;
  KvOptionInfo o{std::move(key), std::move(flag), std::move(alias), value,  std::move(help),
                 false,          false,           nullptr,          nullptr};
  o.set = [f, mark, names, value, k = o.key](KvCacheParams* p, KvParamsGiven* g,
                                             const std::string& v) {
    for (const auto& [n, e] : names)
      if (n == v) {
        p->*f = e;
        if (mark) g->*mark = true;
        return Status::ok();
      }
    return Status::error(fmt::format("{} must be {}, got '{}'", k, value, v));
  };
  o.get = [f, names](const KvCacheParams& p) {
    for (const auto& [n, e] : names)
      if (e == p.*f) return n;
    return std::string();
  };
  return o;
}

// The policy, its budget and the geometry of its regions.
void add_budget_rows(std::vector<KvOptionInfo>& r) {
  {
    KvOptionInfo o = row("policy", "--kv-policy", "NAME", "", true, false);
    o.set = [](KvCacheParams* p, KvParamsGiven*, const std::string& v) {
      if (!find_policy(v))
        return Status::error(
            fmt::format("unknown KV policy '{}' (known: {})", v, policy_names(", ")));
      p->policy = v;
      return Status::ok();
    };
    o.get = [](const KvCacheParams& p) { return p.policy; };
    r.push_back(std::move(o));
  }
  {
    KvOptionInfo o =
        row("budget", "--kv-budget", "FRACTION",
            "KV budget per layer as a fraction of the full cache for the context's tokens", false,
            false);
    o.set = [](KvCacheParams* p, KvParamsGiven*, const std::string& v) {
      double x = 0.0;
      QEVICT_RETURN_IF_ERROR(parse_double("budget", v, &x));
      if (!(x > 0.0 && x <= 1e6))
        return Status::error(fmt::format("budget must be a positive fraction, got {}", v));
      p->budget_fraction = x;
      return Status::ok();
    };
    o.get = [](const KvCacheParams& p) { return fmt::format("{:g}", p.budget_fraction); };
    r.push_back(std::move(o));
  }
  {
    KvOptionInfo o = row("budget_bytes", "--kv-budget-bytes", "BYTES",
                         "KV budget per layer in bytes", false, false);
    o.set = [](KvCacheParams* p, KvParamsGiven*, const std::string& v) {
      int64_t x = 0;
      QEVICT_RETURN_IF_ERROR(parse_int("budget_bytes", v, &x));
      if (x < 0) return Status::error("budget_bytes must be >= 0");
      // Capacities derived from it are counts of tokens (int): a petabyte is past any cache.
      if (x > (int64_t(1) << 50))
        return Status::error(fmt::format("budget_bytes {} is past any cache (at most 2^50)", x));
      p->budget_bytes = x;
      return Status::ok();
    };
    o.get = [](const KvCacheParams& p) { return std::to_string(p.budget_bytes); };
    r.push_back(std::move(o));
  }
  {
    KvOptionInfo o =
        row("q", "--kv-q", "SHARE",
            "share of the history budget for the low-bit tier (0: two tiers F+E; "
            "streaming default 0; zipcache: the share of tokens at low bits, 0.4; kvquant: "
            "the outlier share, 0.01)",
            false, false);
    o.set = [](KvCacheParams* p, KvParamsGiven* g, const std::string& v) {
      QEVICT_RETURN_IF_ERROR(parse_double("q", v, &p->q));
      g->q = true;
      return Status::ok();
    };
    o.get = [](const KvCacheParams& p) { return fmt::format("{:g}", p.q); };
    r.push_back(std::move(o));
  }
  {
    KvOptionInfo o =
        row("adapt", "--kv-adapt", "NATS",
            "qevict with --prefill-route end: at the prompt's end, when its last queries look "
            "where the text itself looks (KL of their attention over the text from the text's "
            "own per query, mean over layers, below NATS: no question about it in view), keep "
            "the text at 2 bits with one-byte key scales and q 0.95 (coverage for questions "
            "that come later); else the configured low-bit tier. 0: off",
            false, false);
    o.set = [](KvCacheParams* p, KvParamsGiven*, const std::string& v) {
      return parse_double("adapt", v, &p->adapt);
    };
    o.get = [](const KvCacheParams& p) { return fmt::format("{:g}", p.adapt); };
    r.push_back(std::move(o));
  }
  r.push_back(int_row("window", "--kv-window", "tokens per window (ω; streaming default 1)",
                      &KvCacheParams::window, &KvParamsGiven::window, true));
  r.push_back(int_row("route_every", "--kv-route-every",
                      "decode steps between routing events (Ω; streaming/h2o default 1; "
                      "zipcache: tokens between requantizations, default 100)",
                      &KvCacheParams::route_every, &KvParamsGiven::route_every));
  r.push_back(int_row("sink", "--kv-sink",
                      "sink tokens kept in full precision (streaming default 4, h2o 0; kvquant: "
                      "first tokens in f16, default 1)",
                      &KvCacheParams::sink, &KvParamsGiven::sink));
  r.push_back(int_row("local", "--kv-local",
                      "newest tokens kept in full precision (h2o default: half the budget; kivi: "
                      "the f16 residual R, default 128)",
                      &KvCacheParams::local, &KvParamsGiven::local));
}

// The low-bit tier, ranking and routing, and the trace.
void add_tier_rows(std::vector<KvOptionInfo>& r) {
  {
    KvOptionInfo o = int_row("bits", "--kv-bits",
                             "low-bit tier: 2 or 4 bits, or auto. Unset: qevict keys 4 and values "
                             "2 (--kv-value-bits), streaming 2, zipcache 2 for the unimportant "
                             "tokens (the rest 4), kvquant 3 (2-4). auto: 4 when the budget holds "
                             "every window of the context at 4 bits, else 2",
                             &KvCacheParams::bits, &KvParamsGiven::bits);
    o.value = "2|4|auto";
    auto set_int = o.set;
    o.set = [set_int](KvCacheParams* p, KvParamsGiven* g, const std::string& v) {
      return set_int(p, g, v == "auto" ? "0" : v);  // the budget picks 4 or 2 (KvBudget::bits)
    };
    r.push_back(std::move(o));
  }
  r.push_back(int_row("value_bits", "--kv-value-bits",
                      "qevict/streaming: the low-bit tier's values at 2 or 4 bits, its keys at "
                      "--kv-bits (0: as --kv-bits)",
                      &KvCacheParams::value_bits, &KvParamsGiven::value_bits, false, "vbits"));
  r.push_back(int_row("key_meta", "--kv-key-meta",
                      "qevict/streaming: the low-bit tier's per-channel key scales and zeros at "
                      "16 bits (f16) or 8 (one byte each: half the key metadata bytes)",
                      &KvCacheParams::key_meta, &KvParamsGiven::key_meta, false, "kmeta"));
  r.back().value = "16|8";
  r.push_back(int_row("group", "--kv-group",
                      "value quantization group (0: head_dim; kivi: G, default 32)",
                      &KvCacheParams::value_group, &KvParamsGiven::value_group));
  r.push_back(enum_row<HalfType>("dtype", "--kv-dtype", "full-precision KV type",
                                 &KvCacheParams::dtype,
                                 {{"f16", HalfType::kF16}, {"bf16", HalfType::kBF16}}, nullptr));
  r.push_back(enum_row<ScoreMode>(
      "score", "--kv-score",
      "window ranking: sum (cumulative attention, the paper's) or age (mean per step since the "
      "window was written)",
      &KvCacheParams::score, {{"sum", ScoreMode::kSum}, {"age", ScoreMode::kAge}}, nullptr));
  r.push_back(int_row("pool", "--kv-pool",
                      "qevict: rank each window by the highest score within this many windows "
                      "either side (SnapKV's pooling, per window; keeps the rest of a value that "
                      "spans windows); 0: its own score. Default 2 with --prefill-route end and "
                      "a prefill window (chosen from the eval suite, EVALUATION.md), else 0",
                      &KvCacheParams::pool, &KvParamsGiven::pool));
  r.push_back(enum_row<PoolSide>(
      "pool_side", "--kv-pool-side",
      "qevict pooling: both (the windows either side of a peak rise with it) or after (only "
      "the windows that follow it: the rest of a value the question found)",
      &KvCacheParams::pool_side, {{"both", PoolSide::kBoth}, {"after", PoolSide::kAfter}},
      nullptr));
  {
    KvOptionInfo o =
        row("strict_ledger", "--kv-strict-ledger", "",
            "charge ledger copies held by promoted windows to the budget", false, true);
    o.set = [](KvCacheParams* p, KvParamsGiven*, const std::string& v) {
      return parse_bool("strict_ledger", v, &p->strict_ledger);
    };
    o.get = [](const KvCacheParams& p) { return std::string(p.strict_ledger ? "1" : "0"); };
    r.push_back(std::move(o));
  }
  r.push_back(enum_row<PrefillRoute>(
      "prefill_route", "--prefill-route",
      "when budgeted caches route the prompt: chunk (after every prefill chunk; peak memory = "
      "budget + one chunk), end (hold the whole prompt in full precision, route once when it "
      "is in; the paper's code; peak memory = the prompt) or staged (qevict: route once when "
      "it is in, as end, but quantize the windows that leave the local region into the "
      "low-bit tier meanwhile; peak memory = the prompt at low bits + one chunk). Default end "
      "(for qevict chosen from the eval suite, EVALUATION.md; the SnapKV family, kivi and "
      "zipcache compress the prompt once in their references), but chunk for streaming, h2o "
      "and kvquant",
      &KvCacheParams::prefill_route,
      {{"chunk", PrefillRoute::kChunk},
       {"end", PrefillRoute::kEnd},
       {"staged", PrefillRoute::kStaged}},
      &KvParamsGiven::prefill_route, "route"));
  r.push_back(
      int_row("prefill_window", "--prefill-window",
              "with --prefill-route end or staged on windowed caches: 0 ranks the prompt by the "
              "cumulative attention of all its queries (Eq. 1); N > 0 by the last N "
              "queries only (SnapKV's observation window, w = 32 in its code). Default 32 "
              "for qevict (chosen from the eval suite, EVALUATION.md), else 0",
              &KvCacheParams::prefill_window, &KvParamsGiven::prefill_window));
  {
    KvOptionInfo o =
        row("trace", "--kv-trace", "PATH",
            "write one JSON line per routing event and layer to this file (kivi: a "
            "directory, where the prompt's quantization is dumped as .npy; kvquant: the "
            "same, with the calibration's activations)",
            true, false);
    o.set = [](KvCacheParams* p, KvParamsGiven*, const std::string& v) {
      p->trace_path = v;
      return Status::ok();
    };
    o.get = [](const KvCacheParams& p) { return p.trace_path; };
    r.push_back(std::move(o));
  }
}

std::vector<KvOptionInfo> make_rows() {
  std::vector<KvOptionInfo> r;
  add_budget_rows(r);
  add_tier_rows(r);
  return r;
}

}  // namespace

const std::vector<KvOptionInfo>& kv_options() {
  static const std::vector<KvOptionInfo> rows = make_rows();
  return rows;
}

const KvOptionInfo* find_kv_option(const std::string& key) {
  for (const KvOptionInfo& o : kv_options())
    if (o.key == key || (!o.alias.empty() && o.alias == key) || o.flag == key) return &o;
  return nullptr;
}

Status set_kv_option(KvCacheParams* p, KvParamsGiven* given, const std::string& key,
                     const std::string& value) {
  const KvOptionInfo* o = find_kv_option(key);
  if (!o) {
    std::string keys;
    for (const KvOptionInfo& x : kv_options()) keys += (keys.empty() ? "" : ", ") + x.key;
    return Status::error(fmt::format("unknown KV option '{}' (known: {})", key, keys));
  }
  return o->set(p, given, value);
}

Status finish_kv_params(KvCacheParams* p, const KvParamsGiven& given) {
  QEVICT_RETURN_IF_ERROR(apply_policy_defaults(p, given));
  return p->validate();
}

Expected<KvCacheParams> make_kv_params(const KvOptionList& opts) {
  KvCacheParams p;
  KvParamsGiven given;
  for (const auto& [k, v] : opts) QEVICT_RETURN_IF_ERROR(set_kv_option(&p, &given, k, v));
  QEVICT_RETURN_IF_ERROR(finish_kv_params(&p, given));
  return p;
}

std::string kv_policy_help() {
  std::string help = "KV cache policy (default: full), one row of the registry each:";
  for (const auto& r : policy_registry()) help += "\n  " + r.name + ": " + r.summary;
  return help;
}

}  // namespace qevict
