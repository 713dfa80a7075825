#pragma once
// Which SIMD instruction sets this CPU (and OS) supports, read with cpuid/xgetbv at run time.
// Kernels pick their implementation from `active_isa()`; TANDEM_ISA=scalar|avx2|avx2vnni|avx512|avx512amx
// caps it (for tests and for comparing paths), never raising it above what the CPU has.
#include <string_view>

namespace tandem {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx_vnni = false;
  // AMX tiles with bf16 dot products, enabled by the OS (XCR0). Linux also grants the tile state
  // only on request (arch_prctl ARCH_REQ_XCOMP_PERM): isa_supported(Isa::Avx512Amx) asks once.
  bool amx_bf16 = false;
  // Who made the CPU and its display family (cpuid leaf 1, extended family added): AMD Zen 4 is
  // 0x19, Zen 5 0x1a. Kernels tune a few choices by it where cores measured differently.
  bool amd = false;
  bool intel = false;
  int family = 0;
};

// Avx2Vnni is AVX2 with AVX-VNNI (the VEX vpdpbusd of Intel's client cores since Alder Lake, its
// E-core Xeons, and Zen 5): the AVX2 table with quantized kernels that multiply bytes in one
// instruction. A CPU may have AVX-512 without it (Zen 4, Skylake-X), so it is not implied by a
// higher level: isa_supported() says whether this CPU runs a level.
//
// Avx512Amx is AVX-512 with AMX tiles (Intel Xeon since Sapphire Rapids): the AVX-512 table with
// BF16 weights multiplied on the tiles for batches and prefill (kernels/cpu/matmul_amx_bf16.cpp).
enum class Isa { Scalar = 0, Avx2 = 1, Avx2Vnni = 2, Avx512 = 3, Avx512Amx = 4 };

const CpuFeatures& cpu_features();
Isa best_supported_isa();             // what this CPU can run
bool isa_supported(Isa isa);          // whether this CPU runs that level
Isa active_isa();                     // the highest level this CPU runs at or below TANDEM_ISA / set_isa_cap
void set_isa_cap(Isa cap);            // tests use this to exercise every path on one machine
std::string_view isa_name(Isa isa);

}  // namespace tandem
