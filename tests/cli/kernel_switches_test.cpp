// tools/kernel_switches.h: the environment variables that turn kernels off are read by the
// frontends only; a variable is off only for the off words, and applying them calls the
// kernels' setters (the library itself reads no environment).
#include "kernel_switches.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace qevict {
namespace {

TEST(KernelSwitches, EnvSwitchIsOffOnlyForTheOffWords) {
  constexpr const char* kName = "QEVICT_TEST_SWITCH_7F3A";
  unsetenv(kName);
  EXPECT_TRUE(cli::env_switch_on(kName));
  for (const char* off : {"0", "off", "OFF", "False", "no", "NO"}) {
    setenv(kName, off, 1);
    EXPECT_FALSE(cli::env_switch_on(kName)) << off;
  }
  // Anything else leaves the kernel on, including words that merely start like an off word.
  for (const char* on : {"1", "on", "true", "yes", "", "00", "0x", "offline", "nope"}) {
    setenv(kName, on, 1);
    EXPECT_TRUE(cli::env_switch_on(kName)) << '"' << on << '"';
  }
  unsetenv(kName);
}

TEST(KernelSwitches, ApplyTurnsOffWhatTheEnvironmentSays) {
  matmul_set_q8(true);
  setenv("QEVICT_Q8", "off", 1);
  unsetenv("QEVICT_AMX");
  unsetenv("QEVICT_PV_INT8");
  cli::apply_env_kernel_switches();
  EXPECT_FALSE(matmul_q8_enabled());
  unsetenv("QEVICT_Q8");
  matmul_set_q8(true);
  const bool on = matmul_q8_enabled();  // true where the CPU has the path
  cli::apply_env_kernel_switches();     // unset: leaves the switch as it is
  EXPECT_EQ(matmul_q8_enabled(), on);
}

}  // namespace
}  // namespace qevict
