#pragma once
// The entry points each ISA's files export to build its KernelTable (kernels_avx2.cpp,
// kernels_avx512.cpp). Only plain functions cross files: every SIMD template stays in an anonymous
// namespace of the file compiled for its ISA, so the linker can never pick an AVX-512 copy of a
// function for code that runs on an older CPU.
#include <cstdint>
#include <span>

#include "kernels/cpu/kernels.h"
#include "kernels/weight.h"

namespace tandem::cpu::detail {

// matmul_rows for Q8/Q4 through a table's quantized entries, quantizing x into a grow-only
// thread-local buffer (dispatch.cpp).
void quantize_then_matmul_rows(const KernelTable& k, const WeightMatrix& w, int64_t r0, int64_t r1, const float* x,
                               int64_t x_stride, int64_t n, float* y, int64_t y_stride);

// 64-byte aligned, grow-only float scratch of the calling thread, one per slot (0-3): the float
// prefill panels keep their packed weights and activations here (slots 0, 1), the quantized
// panels their packed weights (slot 2) (dispatch.cpp).
float* thread_scratch_floats(int slot, size_t floats);

// Float weights (F32/F16/BF16), x float32 rows.
void avx512_matmul_rows_float(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                              int64_t n, float* y, int64_t y_stride);
// 1-8 tokens over up to kMatvecStreams runs of BF16/F16 row groups (KernelTable::matvec_streams).
void avx512_matvec_streams_float(std::span<const RowRun> runs, const float* x, int64_t x_stride, int64_t n);
void avx2_matmul_rows_float(const WeightMatrix& w, int64_t r0, int64_t r1, const float* x, int64_t x_stride,
                            int64_t n, float* y, int64_t y_stride);

// Interleaved BF16 weights on AMX tiles for 2 tokens or more (matmul_amx_bf16.cpp), in the two steps
// of the quantized kernels: the activations split into bf16 parts, packed for the tiles, then
// the matmul over them. Only when cpu_features().amx_bf16.
bool amx_bf16_multiplies(const WeightMatrix& w, int64_t n);
int64_t amx_bf16_activation_stride(const WeightMatrix& w, int64_t n);
void amx_bf16_prepare_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                                  int64_t count, uint8_t* out, int64_t out_stride);
void amx_bf16_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xp, int64_t xp_stride, int64_t n,
                     float* y, int64_t y_stride);

// Quantized weights with AVX-512 VNNI (vpdpbusd); only when cpu_features().avx512_vnni.
int64_t avx512vnni_activation_stride(const WeightMatrix& w, int64_t n);
void avx512vnni_quantize_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                                     int64_t count, uint8_t* out, int64_t out_stride);
void avx512vnni_matmul_rows_quantized(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                      int64_t xq_stride, int64_t n, float* y, int64_t y_stride);

// The prefill half of the above (matmul_avx512_vnni_panel.cpp): one token's activations in the
// panel layout, and the panel matmul over them.
int64_t avx512vnni_panel_stride(int64_t cols);
void avx512vnni_panel_quantize(WeightFormat format, int64_t cols, const float* x, uint8_t* out);
void avx512vnni_panel_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                             int64_t n, float* y, int64_t y_stride);

// Interleaved Q8/Q4 weights (matmul_avx512_vnni_interleaved.cpp), activations in the panel layout.
void avx512vnni_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                   int64_t xq_stride, int64_t n, float* y, int64_t y_stride);

// Quantized weights with AVX2 (vpmaddubsw), also used by the AVX-512 table on CPUs without VNNI.
int64_t avx2_activation_stride(const WeightMatrix& w, int64_t n);
void avx2_quantize_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                               int64_t count, uint8_t* out, int64_t out_stride);
void avx2_matmul_rows_quantized(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                int64_t xq_stride, int64_t n, float* y, int64_t y_stride);

// From this many tokens on the quantized kernels pack weight panels (matmul_avx2_quant.cpp).
constexpr int64_t kQuantPanelMinTokens = 16;

// What the 16 corrections of the AVX2 panel activation layout hold: for vpmaddubsw Q4's int16
// word pairs (0 for Q8), for vpdpbusd on unsigned codes -8 x each block's code sum as an int32.
enum class PanelCorrections { MaddubsWords, DpbusdBlockSums };

// The prefill half of the above (matmul_avx2_quant_panel.cpp): one token's activations in the
// panel layout, and the panel matmul over them (plain Q8/Q4).
int64_t avx2_panel_stride(int64_t cols);
void avx2_panel_quantize(WeightFormat format, int64_t cols, const float* x, uint8_t* out,
                         PanelCorrections kind = PanelCorrections::MaddubsWords);
void avx2_panel_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride, int64_t n,
                       float* y, int64_t y_stride);
// Rows [r0, r1), 256-column chunks [ch0, ch0 + nc) of Q8/Q4 weights (either layout) packed into a
// panel (row i at panel + i * nc * 288): Q8 codes signed, or q + 128 if q8_offset.
void avx2_pack_quant_panel(const WeightMatrix& w, int64_t r0, int64_t r1, int64_t ch0, int64_t nc, uint8_t* panel,
                           bool q8_offset);
// Interleaved Q8/Q4 weights (activations in the panel layout), in tiles of up to 8 tokens over each
// row group (matmul_avx2_interleaved.cpp); the table takes it for 1-15 tokens, the panels above
// (packed from the row groups) from 16 on.
void avx2_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                             int64_t n, float* y, int64_t y_stride);

// The AVX2 quantized kernels with AVX-VNNI's vpdpbusd (matmul_avxvnni_*.cpp), the AVX2 table's
// entries when the CPU has it (Isa::Avx2Vnni): the same activation layouts (the panel layout's
// corrections as PanelCorrections::DpbusdBlockSums) and the same results; plain weights with
// fewer than 16 tokens keep the vpmaddubsw tiles.
void avxvnni_quantize_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                                  int64_t count, uint8_t* out, int64_t out_stride);
void avxvnni_matmul_rows_quantized(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                   int64_t xq_stride, int64_t n, float* y, int64_t y_stride);
void avxvnni_panel_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq, int64_t xq_stride,
                          int64_t n, float* y, int64_t y_stride);
void avxvnni_interleaved_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xq,
                                int64_t xq_stride, int64_t n, float* y, int64_t y_stride);

}  // namespace tandem::cpu::detail
