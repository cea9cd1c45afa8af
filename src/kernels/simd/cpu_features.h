// What the CPU offers the hand-written x86 kernels, and the environment switches that turn
// those kernels off. One place for both, so that every path asks the same question the same
// way (matmul_q8.cpp, lowbit_i8.cpp and matmul_amx.cpp did it each in their own copy).
#pragma once

namespace qevict::cpu {

// AVX-512 F/BW/VL with VNNI (8-bit dot products), F16C and FMA, as the CPU and OS report
// them (GCC's __builtin_cpu_supports checks that the OS saves the AVX-512 state). Evaluated
// once; false off x86-64.
bool avx512_vnni();
// avx512_vnni() and VBMI (byte permutes across the whole vector).
bool avx512_vnni_vbmi();

// A kernel switch read from the environment: false when the variable is set to "0", "off",
// "false" or "no" (any case), true when it is unset or set to anything else. Read each time
// it is called; callers read it once, at start-up.
bool env_switch_on(const char* name);

}  // namespace qevict::cpu
