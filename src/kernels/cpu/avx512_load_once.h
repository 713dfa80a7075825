#pragma once
// A load the compiler keeps as one instruction. Include inside the including file's AVX-512
// target pragma.
//
// A Q4 weight line feeds two instructions (the low nibbles by a mask, the high by a shift and a
// mask), and GCC folds the load into both as memory operands: two loads of a line that comes from
// DRAM. The empty asm makes the loaded value opaque, so it stays in a register. That mattered in
// the row groups' one-token tile, which leaves its stream to the hardware prefetchers (docs/kernels.md,
// "One load per weight line"); tiles that prefetch their lines in software, and reads from L1,
// measured the same either way.
#include <immintrin.h>

namespace tandem::cpu::detail {
namespace {  // each including file its own copy, compiled for its target

inline __m512i load_once(const void* p) {
  __m512i v = _mm512_loadu_si512(p);
  asm("" : "+v"(v));
  return v;
}

}  // namespace
}  // namespace tandem::cpu::detail
