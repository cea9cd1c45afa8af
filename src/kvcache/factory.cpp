// make_kv_cache (see factory.h).
#include "kvcache/factory.h"

#include <fmt/format.h>

#include "kvcache/budget.h"
#include "kvcache/full_cache.h"
#include "kvcache/head_cache.h"
#include "kvcache/kivi_cache.h"
#include "kvcache/kvquant_cache.h"
#include "kvcache/registry.h"
#include "kvcache/routing_observer.h"
#include "kvcache/tiered_cache.h"
#include "kvcache/zipcache_cache.h"

namespace qevict {

Expected<std::unique_ptr<SequenceKvCache>> make_kv_cache(const KvShape& shape, int64_t n_ctx,
                                                         const KvCacheParams& p) {
  QEVICT_RETURN_IF_ERROR(shape.validate());
  QEVICT_RETURN_IF_ERROR(p.validate());
  if (n_ctx <= 0) return Status::error("context size must be positive");
  const PolicyInfo* row = find_policy(p.policy);  // validate() found it
  auto budget = compute_budget(row->kind, shape, n_ctx, p);
  if (!budget) return budget.status();
  switch (row->kind) {
    case CacheKind::kFull:
      return std::unique_ptr<SequenceKvCache>(new FullKvCache(shape, n_ctx, p.dtype));
    case CacheKind::kPerHead: {
      auto policy = row->make_policy(p);
      QEVICT_RETURN_IF_ERROR(fit_head_budget(&*budget, shape, n_ctx, p, policy->needs()));
      return std::unique_ptr<SequenceKvCache>(
          new HeadKvCache(shape, n_ctx, p, *budget, std::move(policy)));
    }
    case CacheKind::kQuantized: {
      if (p.policy == "kvquant") {
        KvQuantConfig c;
        c.bits = p.bits;
        c.sparsity = 1.0 - p.q;
        c.first_fp16 = p.sink;
        QEVICT_RETURN_IF_ERROR(c.validate());
        if (p.dtype != HalfType::kF16)
          return Status::error("kvquant keeps its parameters and first tokens in f16");
        const auto& cal = p.kvquant_calib;
        if (!cal)
          return Status::error(
              "kvquant needs the model's calibration (made from a calibration text by "
              "engine/kvquant_calibration.h; the CLI does it when --kv-policy kvquant is given)");
        if (int(cal->size()) != shape.n_layers)
          return Status::error(fmt::format("kvquant: the calibration has {} layers, the model {}",
                                           cal->size(), shape.n_layers));
        for (const KvQuantLayerCalib& l : *cal)
          if (int(l.k_upper.size()) != shape.kv_width() ||
              int(l.k_lower.size()) != shape.kv_width() || l.k_offset.size() != l.k_upper.size() ||
              l.k_range.size() != l.k_upper.size() || l.k_lut.size() != (size_t(1) << c.bits) ||
              l.v_lut.size() != (size_t(1) << c.bits))
            return Status::error(fmt::format(
                "kvquant: the calibration does not fit this model or --kv-bits {}", c.bits));
        // --kv-trace DIR: the prompt's quantization is dumped there (KvQuantCache::dump_prompt).
        return std::unique_ptr<SequenceKvCache>(
            new KvQuantCache(shape, n_ctx, c, cal, p.trace_path));
      }
      if (p.policy == "zipcache") {
        ZipCacheConfig c;
        c.lo_bits = p.bits;
        c.unimportant_ratio = p.q;
        c.gap = p.route_every;
        QEVICT_RETURN_IF_ERROR(c.validate());
        if (p.dtype != HalfType::kF16)
          return Status::error("zipcache keeps its buffer and parameters in f16, as the reference");
        if (!p.trace_path.empty() && p.prefill_route != "end")
          return Status::error(
              "--kv-trace DIR with zipcache dumps the prompt's rule at its end: it needs "
              "--prefill-route end");
        return std::unique_ptr<SequenceKvCache>(new ZipKvCache(shape, n_ctx, p, c));
      }
      const KiviConfig c{p.bits, p.value_group, p.local};
      QEVICT_RETURN_IF_ERROR(c.validate(shape.head_dim));
      if (p.dtype != HalfType::kF16)
        return Status::error("kivi keeps its residual and parameters in f16, as the reference");
      if (!p.trace_path.empty() && p.prefill_route != "end")
        return Status::error(
            "--kv-trace DIR with kivi dumps the prompt's quantization at its end: it needs "
            "--prefill-route end");
      return std::unique_ptr<SequenceKvCache>(new KiviKvCache(shape, n_ctx, p, c));
    }
    case CacheKind::kWindowed: {
      std::unique_ptr<RoutingObserver> trace;
      if (!p.trace_path.empty()) {
        auto t = RoutingTrace::open(p.trace_path);
        if (!t) return t.status();
        trace = std::move(*t);
      }
      KvCacheParams pw = p;
      pw.bits = budget->bits;  // --kv-bits auto resolved by the budget
      return std::unique_ptr<SequenceKvCache>(
          new TieredKvCache(shape, n_ctx, pw, *budget, row->make_policy(pw), std::move(trace)));
    }
  }
  return Status::error("unknown cache kind");
}

}  // namespace qevict
