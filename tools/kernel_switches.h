// The kernel switches' environment variables, read by the frontends only (the qevict CLI at
// start-up, the Python module when imported): QEVICT_AMX, QEVICT_Q8 and QEVICT_PV_INT8 set to
// "0", "off", "false" or "no" (any case) turn the AMX prefill matmul, the 8-bit-activation
// matmul and the 8-bit P·V off, through the kernels' setters (kernels/matmul.h, lowbit.h).
// The library reads no environment: every switch is on until a setter turns it off.
#pragma once

#include <cctype>
#include <cstdlib>
#include <string>

#include "kernels/lowbit.h"
#include "kernels/matmul.h"

namespace qevict::cli {

// A kernel switch read from the environment: false when the variable is set to "0", "off",
// "false" or "no" (any case), true when it is unset or set to anything else.
inline bool env_switch_on(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return true;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(s == "0" || s == "off" || s == "false" || s == "no");
}

// Turns off each switch whose variable says so; leaves the others as they are.
inline void apply_env_kernel_switches() {
  if (!env_switch_on("QEVICT_AMX")) matmul_set_amx(false);
  if (!env_switch_on("QEVICT_Q8")) matmul_set_q8(false);
  if (!env_switch_on("QEVICT_PV_INT8")) set_qwin_pv_i8_enabled(false);
}

}  // namespace qevict::cli
