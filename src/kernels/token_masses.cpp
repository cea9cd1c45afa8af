// attend_blocks' per-token masses (token_masses.h). Optimized path: qk_scores_rows and
// exp_scale_accumulate (ops.h) do the arithmetic; this file walks chunks of tokens.
#include "kernels/token_masses.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/ops.h"
#include "kernels/pool_slots.h"

namespace qevict {

void token_masses(const FusedAttnParams& fp, int H, const float* q, int64_t ldq, int64_t n_q,
                  int64_t qpos0, const KvBlockRef* blocks, const int64_t* head_off,
                  const int64_t* unit_off, const float* gml, double* mass, MassLayout layout,
                  BlockAttnScratch& sc, ThreadPool& pool) {
  const int g = fp.group, d = fp.head_dim;
  // Every head's tokens in unit order: key row and position (the caller's scratch: it grows
  // with the tokens, so it counts as the cache's bytes).
  const int64_t n_units = unit_off[head_off[H]];
  std::vector<const uint16_t*>& tok_k = sc.tok_k;
  std::vector<int64_t>& tok_pos = sc.tok_pos;
  tok_k.resize(size_t(n_units));
  tok_pos.resize(size_t(n_units));
  for (int64_t b = 0; b < head_off[H]; ++b)
    for (int j = 0; j < blocks[b].n; ++j) {
      tok_k[unit_off[b] + j] = blocks[b].k + j * blocks[b].ld;
      tok_pos[unit_off[b] + j] = blocks[b].pos0 + j;
    }
  const bool per_head = layout == MassLayout::kPerHeadBlock;
  int64_t nu_max = 0;
  for (int h = 0; h < H; ++h)
    nu_max = std::max(nu_max, unit_off[head_off[h + 1]] - unit_off[head_off[h]]);
  constexpr int64_t kChunk = 256, kQ = 16;
  const int64_t chunks = (nu_max + kChunk - 1) / kChunk;
  const int64_t tasks = per_head ? H * chunks : chunks;
  // Scratch for what this call needs: its queries (decode: one) and its longest chunk.
  const int64_t q_max = std::min(kQ, n_q), lds = std::min(kChunk, nu_max);
  const uint16_t* const* tk = tok_k.data();
  const int64_t* tp = tok_pos.data();
  sc.reserve_slots(pool.size());
  parallel_for_slots(pool, tasks, 1, [&](int t, int64_t k0, int64_t k1) {
    FusedAttnScratch& ws = sc.threads[size_t(t)];
    std::vector<float>&qrows = ws.qrows, &S = ws.scores;
    std::vector<double>& acc = ws.acc;
    scratch_fit(qrows, size_t(q_max) * g * d);
    scratch_fit(S, size_t(q_max) * g * lds);
    scratch_fit(acc, size_t(lds));
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t c = k % chunks;
      const int h_lo = per_head ? int(k / chunks) : 0, h_hi = per_head ? h_lo + 1 : H;
      for (int h = h_lo; h < h_hi; ++h) {
        const int64_t u0 = unit_off[head_off[h]], nu = unit_off[head_off[h + 1]] - u0;
        const int64_t b0 = c * kChunk, b1 = std::min(nu, b0 + kChunk);
        if (b0 >= b1) continue;
        const int n = int(b1 - b0);
        const int64_t* pos = tp + u0 + b0;  // ascending: blocks are in position order
        std::fill(acc.begin(), acc.begin() + n, 0.0);
        for (int64_t t0 = std::max<int64_t>(0, pos[0] - qpos0); t0 < n_q; t0 += kQ) {
          const int nq = int(std::min(kQ, n_q - t0));
          for (int i = 0; i < nq; ++i)
            std::memcpy(qrows.data() + size_t(i) * g * d, q + (t0 + i) * ldq + size_t(h) * g * d,
                        sizeof(float) * size_t(g) * d);
          // Tokens past the group's last query are seen by none of it.
          const int n_any = int(std::upper_bound(pos, pos + n, qpos0 + t0 + nq - 1) - pos);
          qk_scores_rows(fp.dtype, qrows.data(), d, nq * g, tk + u0 + b0, n_any, d, fp.scale,
                         S.data(), lds);
          for (int i = 0; i < nq; ++i) {
            const int64_t qpos = qpos0 + t0 + i;
            const int nv = int(std::upper_bound(pos, pos + n_any, qpos) - pos);
            if (nv == 0) continue;
            const float* ml = gml + (size_t(t0 + i) * H + h) * g * 2;
            for (int j = 0; j < g; ++j) {
              const float M = ml[2 * j], L = ml[2 * j + 1];
              if (!(L > 0.0f)) continue;
              exp_scale_accumulate(S.data() + size_t(i * g + j) * lds, nv, M, 1.0f / L, acc.data());
            }
          }
        }
        double* mh = per_head ? mass + u0 + b0 : mass + b0;
        for (int u = 0; u < n; ++u) mh[u] += acc[u];
      }
    }
  });
  sc.even_out();
}

}  // namespace qevict
