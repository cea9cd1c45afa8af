// The oracle LIR of the diagnose runner (SPEC §8): the global LIR the R3 geometry would have
// if windows were ranked by FullKV's own attention.
#include <algorithm>

#include "eval/diagnose_internal.h"

namespace qevict::eval::detail {

// Oracle LIR in R3's geometry and F capacity: rank windows at each R3 routing event by
// FullKV attention — (a) received so far (the exact version of the online score, with no
// compression feedback), (b) received from then to the end of the run (hindsight).
json oracle_json(const Variant& r3, const Recorder& rec, const std::vector<float>& hist,
                 const DiagnoseOptions& o, int NL, int64_t n_ctx) {
  const KvBudget& B = r3.report.budget;
  const int S = B.sink, W = B.window;
  const int64_t K = B.capacity_full;
  std::vector<std::vector<double>> decode_total(size_t(NL), std::vector<double>(n_ctx, 0.0));
  for (int64_t t = 0; t < o.gen; ++t)
    for (int l = 0; l < NL; ++l) {
      const float* row = hist.data() + (size_t(t) * NL + l) * n_ctx;
      for (int64_t p = 0; p < n_ctx; ++p) decode_total[l][p] += row[p];
    }
  std::vector<std::vector<double>> cum(size_t(NL), std::vector<double>(n_ctx, 0.0));
  LirCounts lir_cum, lir_fut;
  std::vector<std::vector<std::vector<uint8_t>>> rows_cum(NL), rows_fut(NL);
  int64_t t_done = 0;  // decode steps folded into cum
  std::vector<double> pos_score(static_cast<size_t>(n_ctx)), wm;
  for (const auto& s : r3.snaps) {
    for (; t_done < s.n_past - o.prefill; ++t_done)
      for (int l = 0; l < NL; ++l) {
        const float* row = hist.data() + (size_t(t_done) * NL + l) * n_ctx;
        for (int64_t p = 0; p < n_ctx; ++p) cum[l][p] += row[p];
      }
    const int64_t n_cand = B.aged_windows(s.n_past);
    const bool has_future = o.gen - t_done >= r3.params.route_every;
    for (int l = 0; l < NL; ++l) {
      const double* pre = rec.prefill_row(l);
      for (int64_t p = 0; p < n_ctx; ++p) pos_score[p] = pre[p] + cum[l][p];
      window_sums(pos_score.data(), n_ctx, S, W, n_cand, &wm);
      rows_cum[l].push_back(top_k_membership(wm, n_cand, K));
      if (has_future) {
        for (int64_t p = 0; p < n_ctx; ++p) pos_score[p] = decode_total[l][p] - cum[l][p];
        window_sums(pos_score.data(), n_ctx, S, W, n_cand, &wm);
        rows_fut[l].push_back(top_k_membership(wm, n_cand, K));
      }
    }
  }
  for (int l = 0; l < NL; ++l) {
    lir_cum += lir_counts(rows_cum[l]);
    lir_fut += lir_counts(rows_fut[l]);
  }
  return {{"geometry", "R3"},
          {"capacity_full", K},
          {"cumulative", lir_json(lir_cum)},
          {"future", lir_json(lir_fut)}};
}

}  // namespace qevict::eval::detail
