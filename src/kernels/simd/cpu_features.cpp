#include "kernels/simd/cpu_features.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

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
  // F16C from CPUID directly: clang before 16 does not know "f16c" in __builtin_cpu_supports
  // (the fuzz build, tools/fuzz.sh, compiles this layer with clang 14).
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
  f.vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") && f16c &&
           __builtin_cpu_supports("fma");
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
