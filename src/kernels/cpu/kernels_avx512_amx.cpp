// The AVX-512 table with AMX tiles: everything as avx512_kernels() does, except 2 tokens or more
// (batches and prefill) over interleaved BF16 weights, which go to the tiles (matmul_amx_bf16.cpp)
// through the table's two-step path, so that matmul() splits and packs the activations once per
// call. One token stays on the FMA streams, which read DRAM faster (0.90 of the probe against
// 0.71 on the tiles, E4B bf16 decode on a Xeon with AMX).
#include "kernels/cpu/isa_kernels.h"
#include "kernels/cpu/kernels.h"

namespace tandem::cpu {

namespace {

const KernelTable& base() { return avx512_kernels(); }

int64_t activation_stride(const WeightMatrix& w, int64_t n) {
  return detail::amx_bf16_multiplies(w, n) ? detail::amx_bf16_activation_stride(w, n)
                                           : base().quantized_activation_stride(w, n);
}

void prepare_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                         int64_t count, uint8_t* out, int64_t out_stride) {
  if (detail::amx_bf16_multiplies(w, n))
    detail::amx_bf16_prepare_activations(w, n, x, x_stride, first, count, out, out_stride);
  else
    base().quantize_activations(w, n, x, x_stride, first, count, out, out_stride);
}

void matmul_rows_prepared(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xp, int64_t xp_stride,
                          int64_t n, float* y, int64_t y_stride) {
  if (detail::amx_bf16_multiplies(w, n))
    detail::amx_bf16_matmul(w, r0, r1, xp, xp_stride, n, y, y_stride);
  else
    base().matmul_rows_quantized(w, r0, r1, xp, xp_stride, n, y, y_stride);
}

void matmul_rows(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride, int64_t n, float* y,
                 int64_t y_stride) {
  if (detail::amx_bf16_multiplies(w, n))
    detail::quantize_then_matmul_rows(avx512amx_kernels(), w, r0, r1, x, x_stride, n, y, y_stride);
  else
    base().matmul_rows(w, r0, r1, x, x_stride, n, y, y_stride);
}

KernelTable make_table() {
  KernelTable t = base();
  t.isa = Isa::Avx512Amx;
  t.matmul_rows = matmul_rows;
  t.quantized_activation_stride = activation_stride;
  t.quantize_activations = prepare_activations;
  t.matmul_rows_quantized = matmul_rows_prepared;
  t.prepares_float = detail::amx_bf16_multiplies;
  return t;
}

}  // namespace

const KernelTable& avx512amx_kernels() {
  static const KernelTable table = make_table();
  return table;
}

}  // namespace tandem::cpu
