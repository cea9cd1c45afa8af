#include "kernels/simd/cpu_features.h"

namespace qevict::cpu {
namespace {

struct Features {
  bool vnni = false;
  bool vbmi = false;
};

Features detect() {
  Features f;
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  f.vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  f.vbmi = __builtin_cpu_supports("avx512vbmi");
#endif
  return f;
}

const Features& features() {
  static const Features f = detect();
  return f;
}

}  // namespace

bool avx512_vnni() { return features().vnni; }
bool avx512_vnni_vbmi() { return features().vnni && features().vbmi; }

}  // namespace qevict::cpu
