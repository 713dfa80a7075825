#include "core/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace tandem {

namespace {

uint64_t read_xcr0() {
  uint32_t eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t(edx) << 32) | eax;
}

// Linux hands a process the 8 KB tile state only once asked (ARCH_REQ_XCOMP_PERM for feature 18,
// XTILEDATA); without it the first tile instruction faults. The grant covers every thread, and is
// asked for the first time the AMX level is considered, not by a process capped below it (the
// grant raises the signal stack size every thread needs).
bool tile_state_granted() {
  static const bool granted = [] {
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return granted;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (__get_cpuid(0, &a, &b, &c, &d)) {
    f.amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163;    // "AuthenticAMD"
    f.intel = b == 0x756e6547 && d == 0x49656e69 && c == 0x6c65746e;  // "GenuineIntel"
  }
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const int base_family = int((a >> 8) & 0xf);
  f.family = base_family == 0xf ? base_family + int((a >> 20) & 0xff) : base_family;
  const bool osxsave = c & (1u << 27);
  const bool avx = c & (1u << 28);
  f.fma = c & (1u << 12);
  f.f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = (xcr0 & 0xe6) == 0xe6;
  if (!os_ymm) return f;
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  f.avx2 = b & (1u << 5);
  const bool amx_tile = d & (1u << 24), amx_bf16 = d & (1u << 22);
  if (os_zmm) {
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.avx512_vnni = c & (1u << 11);
  }
  __cpuid_count(7, 1, a, b, c, d);
  f.avx_vnni = a & (1u << 4);
  if (os_zmm) f.avx512_bf16 = a & (1u << 5);
  const bool os_tiles = (xcr0 & 0x60000) == 0x60000;  // XTILECFG and XTILEDATA
  f.amx_bf16 = os_zmm && os_tiles && amx_tile && amx_bf16;
  return f;
}

Isa isa_from_env(Isa fallback) {
  const char* env = std::getenv("TANDEM_ISA");
  if (!env) return fallback;
  std::string v(env);
  if (v == "scalar") return Isa::Scalar;
  if (v == "avx2") return Isa::Avx2;
  if (v == "avx2vnni") return Isa::Avx2Vnni;
  if (v == "avx512") return Isa::Avx512;
  if (v == "avx512amx") return Isa::Avx512Amx;
  return fallback;
}

std::atomic<int> g_cap{-1};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool isa_supported(Isa isa) {
  const CpuFeatures& f = cpu_features();
  // Every SIMD table also runs AVX2 code (the AVX-512 one its quantized fallbacks and attention).
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx2Vnni: return avx2 && f.avx_vnni;
    case Isa::Avx512: return avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
    case Isa::Avx512Amx: return isa_supported(Isa::Avx512) && f.amx_bf16 && tile_state_granted();
  }
  return false;
}

namespace {

// The highest level this CPU runs at or below `cap`.
Isa highest_supported(Isa cap) {
  for (int level = int(cap); level > int(Isa::Scalar); --level)
    if (isa_supported(Isa(level))) return Isa(level);
  return Isa::Scalar;
}

}  // namespace

Isa best_supported_isa() { return highest_supported(Isa::Avx512Amx); }

Isa active_isa() {
  int cap = g_cap.load(std::memory_order_relaxed);
  if (cap < 0) {
    cap = int(isa_from_env(Isa::Avx512Amx));
    g_cap.store(cap, std::memory_order_relaxed);
  }
  return highest_supported(Isa(std::clamp(cap, int(Isa::Scalar), int(Isa::Avx512Amx))));
}

void set_isa_cap(Isa cap) { g_cap.store(int(cap), std::memory_order_relaxed); }

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx2Vnni: return "avx2vnni";
    case Isa::Avx512: return "avx512";
    case Isa::Avx512Amx: return "avx512amx";
  }
  return "?";
}

}  // namespace tandem
