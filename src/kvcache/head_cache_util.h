// Helpers shared by the files of HeadKvCache (head_cache*.cpp): vector capacity that decode
// stops growing, and the attention blocks of a head's kept rows. Internal to kvcache/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention.h"

namespace qevict {
namespace head_cache_detail {

// Grows v's capacity to `need` elements: geometrically, but not past `steady` (the most a
// decode step needs) unless `need` itself is larger, so decode stops allocating at `steady`.
template <typename T>
void reserve_capped(std::vector<T>& v, size_t need, size_t steady) {
  if (v.capacity() >= need) return;
  v.reserve(std::max(need, std::min(steady, 2 * v.capacity())));
}

// Gives back capacity above max(cap, size) elements (a prefill chunk's peak after routing).
template <typename T>
void trim(std::vector<T>& v, size_t cap) {
  cap = std::max(cap, v.size());
  if (v.capacity() <= cap) return;
  std::vector<T> w;
  w.reserve(cap);
  w.assign(v.begin(), v.end());
  v.swap(w);
}

// Appends one attention block per run of consecutive positions of a head's kept rows
// (pos ascending; k and v half [rows][d]).
inline void append_runs(const std::vector<int32_t>& pos, const uint16_t* k, const uint16_t* v,
                        int d, std::vector<KvBlockRef>* out) {
  const int64_t n = int64_t(pos.size());
  for (int64_t i = 0; i < n;) {
    int64_t e = i + 1;
    while (e < n && pos[size_t(e)] == pos[size_t(e - 1)] + 1) ++e;
    KvBlockRef r;
    r.pos0 = pos[size_t(i)];
    r.n = int32_t(e - i);
    r.k = k + i * d;
    r.v = v + i * d;
    r.ld = d;
    out->push_back(r);
    i = e;
  }
}

}  // namespace head_cache_detail
}  // namespace qevict
