// The built-in rows of the policy registry (see registry.h).
#include "kvcache/registry.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvcache/full_cache.h"
#include "kvcache/head_cache.h"
#include "kvcache/policies/adakv_policy.h"
#include "kvcache/policies/criticalkv_policy.h"
#include "kvcache/policies/defensivekv_policy.h"
#include "kvcache/policies/h2o_policy.h"
#include "kvcache/policies/pyramidkv_policy.h"
#include "kvcache/policies/qevict_policy.h"
#include "kvcache/policies/snapkv_policy.h"
#include "kvcache/policies/streaming_policy.h"
#include "kvcache/quantizers/kivi_cache.h"
#include "kvcache/quantizers/kvquant_cache.h"
#include "kvcache/quantizers/zipcache_cache.h"
#include "kvcache/routing_observer.h"
#include "kvcache/tiered_cache.h"

namespace qevict {

namespace {

// The defaults the SnapKV family (issue 10) shares: per-head token caches with no sink, the
// observation window w as the recent region, the prompt compressed once at its end (every
// reference does; --prefill-route chunk stays available), the rule re-applied every
// Ω = w decode steps, and, with no budget, the authors' capacity (`tokens` per KV head) or
// budget fraction. Errors on options that do not apply (no windows, no low-bit tier).
Status family_defaults(KvCacheParams* p, const KvParamsGiven& given, int w, int64_t tokens,
                       double fraction) {
  if (given.window || given.q || given.bits)
    return Status::error(fmt::format(
        "--kv-window, --kv-q and --kv-bits do not apply to {} (token level, full precision)",
        p->policy));
  if (!given.sink) p->sink = 0;
  if (!given.local) p->local = w;
  if (!given.route_every) p->route_every = w;
  if (!given.prefill_route) p->prefill_route = PrefillRoute::kEnd;
  p->window = 1;
  p->q = 0.0;
  if (!(p->budget_fraction > 0.0) && p->budget_bytes <= 0 && p->budget_tokens <= 0) {
    if (tokens > 0) p->budget_tokens = tokens;
    if (tokens <= 0) p->budget_fraction = fraction;
  }
  return Status::ok();
}

// FullKV, qevict and the rules that share its tiered cache or H2O's per-head one.
void add_routed_rows(std::deque<PolicyInfo>& rows) {
  {
    PolicyInfo r;
    r.name = "full";
    r.summary = "FullKV: every token in f16/bf16 pages, no budget";
    r.source = "the uncompressed reference";
    r.kind = CacheKind::kFull;
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "qevict";
    r.summary =
        "three tiers F / low-bit Q (keys 4, values 2 bits) / E of ω-token windows, routed every "
        "Ω steps (QEvict)";
    r.source = "arXiv 2608.05326 §4 (Eq. 1–6, Algorithm 1); defaults SPEC §1–5";
    r.kind = CacheKind::kWindowed;
    r.uses_score = true;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      // The prompt is routed once it is in (end), ranked by its last 32 queries, unless told
      // otherwise: chosen from the 4K suite (EVALUATION.md "The default scorer"), where the
      // window led the cumulative S̄ of every prompt query (Eq. 1) by 23-29 macro points at
      // 20 / 10 / 5 %, and end led chunk by 34 with it (sensitivity at 20 %). chunk stays
      // one flag away for a peak bounded by the budget + one chunk.
      if (!given.prefill_route) p->prefill_route = PrefillRoute::kEnd;
      if (p->defers_prompt() && !given.prefill_window) p->prefill_window = 32;
      // With the window scorer, a window ranks with the best within 2 windows of it: the
      // question's queries find a long value's first window, and the rest of the value stays
      // with it (4K, 20 %: RULER macro 65.6 -> 74.8, FullKV 72.3; niah_single_3 2/10 -> 10/10;
      // EVALUATION.md "Pooling").
      if (p->defers_prompt() && p->prefill_window > 0 && !given.pool) p->pool = 2;
      // The low-bit tier keeps keys at 4 bits and values at 2 (K4V2) unless told otherwise:
      // the suite's best layout (8K, 10 per task, RULER macro at 20 / 10 / 5 %: 71.3 / 72.4 /
      // 69.8 against INT2's 68.2 / 70.9 / 67.0; EVALUATION.md "Which low-bit layout") at
      // 1.24x INT2's bytes per window. A copied UUID needs its keys' precision, not its
      // values'. --kv-bits 2 is the paper's INT2.
      if (!given.bits) {
        p->bits = 4;
        if (!given.value_bits) p->value_bits = 2;
      }
      return Status::ok();
    };
    r.make_policy = [](const KvCacheParams& p) -> std::unique_ptr<RoutingPolicy> {
      return std::make_unique<QEvictPolicy>(p.score, p.pool, p.pool_side == PoolSide::kAfter);
    };
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "streaming";
    r.summary = "StreamingLLM: attention sinks + the most recent tokens";
    r.source =
        "Xiao et al., ICLR 2024; authors' defaults: 4 sink tokens, token level, evict every step";
    r.kind = CacheKind::kWindowed;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      if (!given.sink) p->sink = 4;
      if (!given.window) p->window = 1;
      if (!given.route_every) p->route_every = 1;
      if (!given.q) p->q = 0.0;
      return Status::ok();
    };
    r.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
      return std::make_unique<StreamingPolicy>();
    };
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "h2o";
    r.summary = "H2O: per-head heavy hitters by accumulated attention + recent tokens";
    r.source =
        "Zhang et al., NeurIPS 2023; authors' defaults: no sink, half the budget recent, evict "
        "every step, per head";
    r.kind = CacheKind::kPerHead;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      if (given.window || given.q || given.bits)
        return Status::error(
            "--kv-window, --kv-q and --kv-bits do not apply to h2o (token level, full precision)");
      if (!given.sink) p->sink = 0;
      if (!given.route_every) p->route_every = 1;
      p->local_half_budget = !given.local;  // half the budget (compute_budget)
      p->window = 1;
      p->q = 0.0;
      return Status::ok();
    };
    r.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
      return std::make_unique<H2OPolicy>();
    };
    rows.push_back(std::move(r));
  }
}

// The SnapKV family (issue 10): per-head caches compressed at the prompt's end.
void add_snapkv_family_rows(std::deque<PolicyInfo>& rows) {
  {
    PolicyInfo r;
    r.name = "snapkv";
    r.summary = "SnapKV: per-head top tokens by the last 32 prompt queries' pooled attention";
    r.source =
        "Li et al. 2024 (arXiv 2404.14469); FasterDecoding/SnapKV snapkv_utils.py:L38-81: w 32, "
        "max_capacity_prompt 2048 tokens, avgpool k 5; per-KV-head selection as kvpress";
    r.kind = CacheKind::kPerHead;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      return family_defaults(p, given, 32, 2048, 0.0);
    };
    r.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
      return std::make_unique<SnapKVPolicy>();
    };
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "pyramidkv";
    r.summary = "PyramidKV: SnapKV with per-layer budgets falling linearly with depth";
    r.source =
        "Cai et al. 2024 (arXiv 2406.02069); kvpress pyramidkv_press.py:L70-84, beta 20; "
        "SnapKV's w 32, k 5, avgpool, 2048 tokens per head on average";
    r.kind = CacheKind::kPerHead;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      return family_defaults(p, given, 32, 2048, 0.0);
    };
    r.make_policy = [](const KvCacheParams& p) -> std::unique_ptr<RoutingPolicy> {
      return std::make_unique<PyramidKVPolicy>(PyramidKVOptions{}, p.sink + std::max(p.local, 0));
    };
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "adakv";
    r.summary =
        "AdaKV (Ada-SnapKV): head-adaptive budgets, floor 0.2, variable-length per-head storage";
    r.source =
        "Feng et al. 2024 (arXiv 2407.11550); FFY0/AdaKV snapkv_utils.py:L303-501, "
        "monkeypatch.py:L34 (w 32, k 7, maxpool), pred.py:L27-29 (floor_alpha 0.2)";
    r.kind = CacheKind::kPerHead;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      return family_defaults(p, given, 32, 2048, 0.0);
    };
    r.make_policy = [](const KvCacheParams&) -> std::unique_ptr<RoutingPolicy> {
      return std::make_unique<AdaKVPolicy>();
    };
    rows.push_back(std::move(r));
  }
  for (const bool adaptive : {false, true}) {
    PolicyInfo r;
    r.name = adaptive ? "criticaladakv" : "criticalkv";
    r.summary = adaptive ? "CriticalAdaKV: CriticalKV's two stages on AdaKV's head budgets"
                         : "CriticalKV: SnapKV scores, then (score + 1e-4) x ||v W_O||_1 for "
                           "half the budget";
    r.source =
        "Feng et al. 2025 (arXiv 2502.03805); kvpress criticalkv_press.py:L37-194 (eps 1e-4, "
        "first stage 0.5, alpha 0.2); SnapKV w 32, k 5, avgpool, 2048 tokens per head";
    r.kind = CacheKind::kPerHead;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      return family_defaults(p, given, 32, 2048, 0.0);
    };
    r.make_policy = [adaptive](const KvCacheParams& p) -> std::unique_ptr<RoutingPolicy> {
      CriticalKVOptions o;
      o.adaptive = adaptive;
      return std::make_unique<CriticalKVPolicy>(o, p.sink + std::max(p.local, 0));
    };
    rows.push_back(std::move(r));
  }
  for (const bool over_layers : {false, true}) {
    PolicyInfo r;
    r.name = over_layers ? "layer-defensivekv" : "defensivekv";
    r.summary = over_layers ? "Layer-DefensiveKV: DefensiveKV with one budget shared by every layer"
                            : "DefensiveKV: defensive (max) window aggregation x value norms, "
                              "head-adaptive";
    r.source =
        "Feng et al. 2025 (arXiv 2510.13334); FFY0/DefensiveKV efficient_defensivekv_press.py:"
        "L158-227 (w 32, k 5), efficient_ada_scorer_press.py:L89-96, "
        "efficient_ada_global_scorer_press.py:L164-192; evaluate.sh cr 0.8 (budget 0.2)";
    r.kind = CacheKind::kPerHead;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      return family_defaults(p, given, 32, 0, 0.2);
    };
    r.make_policy = [over_layers](const KvCacheParams& p) -> std::unique_ptr<RoutingPolicy> {
      DefensiveKVOptions o;
      o.over_layers = over_layers;
      return std::make_unique<DefensiveKVPolicy>(o, p.sink + std::max(p.local, 0));
    };
    rows.push_back(std::move(r));
  }
}

// The quantizers (kvcache/quantizers/): every token kept, no budget, each its own cache.
void add_quantizer_rows(std::deque<PolicyInfo>& rows) {
  {
    PolicyInfo r;
    r.name = "kivi";
    r.summary =
        "KIVI-2/4: keys per channel, values per token, 2 or 4 bits (--kv-bits) in groups of "
        "32, an f16 residual of the 128 newest tokens; no budget, its byte point";
    r.source =
        "Liu et al., ICML 2024 (arXiv 2402.02750); jy-yuan/KIVI quant/new_pack.py:L217-252, "
        "models/llama_kivi.py:L131-220; LongBench setup G 32, R 128 (docs/long_bench.md:L7,L30)";
    r.kind = CacheKind::kQuantized;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      if (given.window || given.q || given.sink || given.route_every)
        return Status::error(
            "--kv-window, --kv-q, --kv-sink and --kv-route-every do not apply to kivi (every "
            "token kept, quantized after each call)");
      // bits: --kv-bits; G: --kv-group (0, the qevict default of head_dim, means KIVI's 32);
      // R: --kv-local.
      p->quant.bits = p->bits;
      p->quant.group = p->value_group != 0 ? p->value_group : 32;
      p->quant.residual = given.local ? p->local : 128;
      if (!given.prefill_route) p->prefill_route = PrefillRoute::kEnd;
      return Status::ok();
    };
    r.make_cache = make_kivi_cache;
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "kvquant";
    r.summary =
        "KVQuant-3b: every token kept, pre-RoPE keys per channel and values per token at 3 bits "
        "(--kv-bits) on calibrated non-uniform levels, 1 % outliers (--kv-q) exact, the first "
        "token (--kv-sink) in f16; no budget, its byte point";
    r.source =
        "Hooper et al., NeurIPS 2024 (arXiv 2401.18079); SqueezeAILab/KVQuant "
        "quant/kvquant/simquant_module_quantizer.py (SimQuant.quantize, quant_fn_nuq_recon, "
        "get_outliers_dynamic), quant/llama_simquant.py (k_proj per channel, v_proj per token); "
        "README recipe --abits 3 --nuq --include_sparse --sparsity-threshold 0.99";
    r.kind = CacheKind::kQuantized;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      if (given.window || given.local || given.route_every)
        return Status::error(
            "--kv-window, --kv-local and --kv-route-every do not apply to kvquant (every token "
            "quantized on arrival; --kv-bits: bits, --kv-q: outlier share, --kv-sink: f16 "
            "first tokens)");
      if (given.value_group)
        return Status::error(
            "--kv-group does not apply to kvquant (per-channel keys, per-token values)");
      p->quant.bits = given.bits ? p->bits : 3;
      p->quant.outlier_share = given.q ? p->q : 0.01;  // sparsity threshold 0.99
      p->quant.f16_first = given.sink ? p->sink : 1;   // --first_few_fp16 (DBRX recipe: 1)
      return Status::ok();
    };
    r.make_cache = make_kvquant_cache;
    r.needs_calibration = true;
    rows.push_back(std::move(r));
  }
  {
    PolicyInfo r;
    r.name = "zipcache";
    r.summary =
        "ZipCache: every token kept, the 40 % least salient per KV head (normalized attention "
        "of probe queries) at 2 bits (--kv-bits), the rest at 4; requantized every 100 tokens";
    r.source =
        "He et al., NeurIPS 2024 (arXiv 2405.14256); ThisisBillhe/ZipCache "
        "zipcache/models/modeling_llama.py:L775-813, CompressUtils/compress_function.py:"
        "L232-259,L645-686; defaults zipcache_generation_demo.py:L8-18 (4/2 bits, ratio 0.4, "
        "streaming_gap 100)";
    r.kind = CacheKind::kQuantized;
    r.apply_defaults = [](KvCacheParams* p, const KvParamsGiven& given) {
      if (given.window || given.sink || given.local)
        return Status::error(
            "--kv-window, --kv-sink and --kv-local do not apply to zipcache (every token kept; "
            "--kv-q is the unimportant ratio, --kv-route-every the requantization gap)");
      // --kv-bits: the low bit width; --kv-q: the share of tokens at it; --kv-route-every:
      // streaming_gap.
      p->quant.bits = p->bits;
      p->quant.low_share = given.q ? p->q : 0.4;
      p->quant.gap = given.route_every ? p->route_every : 100;
      if (!given.prefill_route) p->prefill_route = PrefillRoute::kEnd;
      return Status::ok();
    };
    r.make_cache = make_zipcache_cache;
    rows.push_back(std::move(r));
  }
}

std::deque<PolicyInfo> built_ins() {
  std::deque<PolicyInfo> rows;
  add_routed_rows(rows);
  add_snapkv_family_rows(rows);
  add_quantizer_rows(rows);
  return rows;
}

std::deque<PolicyInfo>& rows() {
  static std::deque<PolicyInfo> r = built_ins();
  return r;
}

}  // namespace

const std::deque<PolicyInfo>& policy_registry() { return rows(); }

const PolicyInfo* find_policy(const std::string& name) {
  for (const auto& r : rows())
    if (r.name == name) return &r;
  return nullptr;
}

std::string policy_names(const std::string& sep) {
  std::string s;
  for (const auto& r : rows()) s += (s.empty() ? "" : sep) + r.name;
  return s;
}

Status register_policy(PolicyInfo row) {
  if (row.name.empty()) return Status::error("a policy needs a name");
  if (find_policy(row.name))
    return Status::error(fmt::format("KV policy '{}' is registered already", row.name));
  if (row.kind != CacheKind::kFull && row.kind != CacheKind::kQuantized && !row.make_policy)
    return Status::error(fmt::format("KV policy '{}' has no routing rule", row.name));
  if (row.kind == CacheKind::kQuantized && !row.make_cache)
    return Status::error(fmt::format("quantizer '{}' has no make_cache (its cache)", row.name));
  rows().push_back(std::move(row));
  return Status::ok();
}

Status apply_policy_defaults(KvCacheParams* p, const KvParamsGiven& given) {
  const PolicyInfo* row = find_policy(p->policy);
  if (!row)
    return Status::error(
        fmt::format("unknown KV policy '{}' (known: {})", p->policy, policy_names(", ")));
  return row->apply_defaults ? row->apply_defaults(p, given) : Status::ok();
}

}  // namespace qevict
