#include "kernels/simd/cpu_features.h"

#include <cctype>
#include <cstdlib>
#include <string>

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

bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return true;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(s == "0" || s == "off" || s == "false" || s == "no");
}

}  // namespace qevict::cpu
