// cpu_features: the feature checks' consistency with each other and with the paths that use
// them. (The switches' environment variables are read in tools/: tests/cli/kernel_switches_test.)
#include "kernels/simd/cpu_features.h"

#include <gtest/gtest.h>

#include "kernels/simd/matmul_q8.h"

namespace qevict {
namespace {

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
