// cpu_features: the environment switches every hand-written kernel reads, and the feature
// checks' consistency with each other and with the paths that use them.
#include "kernels/simd/cpu_features.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "kernels/simd/matmul_q8.h"

namespace qevict {
namespace {

TEST(CpuFeatures, EnvSwitchIsOffOnlyForTheOffWords) {
  constexpr const char* kName = "QEVICT_TEST_SWITCH_7F3A";
  unsetenv(kName);
  EXPECT_TRUE(cpu::env_switch_on(kName));
  for (const char* off : {"0", "off", "OFF", "False", "no", "NO"}) {
    setenv(kName, off, 1);
    EXPECT_FALSE(cpu::env_switch_on(kName)) << off;
  }
  // Anything else leaves the kernel on, including words that merely start like an off word.
  for (const char* on : {"1", "on", "true", "yes", "", "00", "0x", "offline", "nope"}) {
    setenv(kName, on, 1);
    EXPECT_TRUE(cpu::env_switch_on(kName)) << '"' << on << '"';
  }
  unsetenv(kName);
}

TEST(CpuFeatures, ChecksAreConsistent) {
  // VBMI on top of VNNI implies VNNI; the 8-bit matmul is available exactly when VNNI is.
  if (cpu::avx512_vnni_vbmi()) {
    EXPECT_TRUE(cpu::avx512_vnni());
  }
  EXPECT_EQ(q8::available(), cpu::avx512_vnni());
  // Evaluated once: asking again gives the same answer.
  EXPECT_EQ(cpu::avx512_vnni(), cpu::avx512_vnni());
}

}  // namespace
}  // namespace qevict
