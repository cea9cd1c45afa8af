// What the CPU offers the hand-written x86 kernels. One place, so that every path asks the
// same question the same way (matmul_q8.cpp and lowbit_i8.cpp did it each in their own copy).
// The switches that turn those kernels off are setters (matmul.h, lowbit.h); the environment
// variables that drive them are read by the frontends (tools/kernel_switches.h).
#pragma once

namespace qevict::cpu {

// AVX-512 F/BW/VL with VNNI (8-bit dot products), F16C and FMA, as the CPU and OS report
// them (GCC's __builtin_cpu_supports checks that the OS saves the AVX-512 state). Evaluated
// once; false off x86-64.
bool avx512_vnni();
// avx512_vnni() and VBMI (byte permutes across the whole vector).
bool avx512_vnni_vbmi();

}  // namespace qevict::cpu
