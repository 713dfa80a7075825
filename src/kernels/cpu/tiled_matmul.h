#pragma once
// The loop nest shared by every SIMD matmul. Each ISA supplies register-tile microkernels (R rows x
// T tokens of dot products, kept in registers over a run of columns); this file walks the tiles in
// an order that keeps a tile's weights in L1 and a block of activations in L2, so each weight
// byte comes from DRAM a few times per prefill and each activation from L2.
#include <cstdint>
#include <utility>

#include "kernels/weight.h"

namespace tandem::cpu {

// The R x T dot products of weight rows [row, row + R) with tokens x + t * x_stride (bytes) over
// columns [k0, k1): y[t * y_stride + row + r] = (accumulate ? y[...] : 0) + dot.
// x is the table's activation layout (float32 rows, or a quantized layout). prefetch_next: decode,
// where each row streams from DRAM once; prefetch the lines to come meanwhile (mostly the next
// tile's rows, row + R ..., at the same columns; see each tile for its own distance).
using TileFn = void (*)(const WeightMatrix& w, int64_t row, const uint8_t* x, int64_t x_stride, int64_t k0,
                        int64_t k1, float* y, int64_t y_stride, bool accumulate, bool prefetch_next);

struct TileSet {
  static constexpr int kMaxRows = 8;
  static constexpr int kMaxTokens = 12;
  int rows = 0;    // R of a full tile
  int tokens = 0;  // T of a full tile
  TileFn fn[kMaxRows][kMaxTokens] = {};  // fn[r - 1][t - 1] for every r <= rows, t <= tokens
  int64_t k_align = 16;                  // column chunks start on multiples of this
  int64_t x_bytes_per_col = 4;           // activation bytes per column, to size the L2 block
};

// y[i * y_stride + r] = W(r, :) . x_i for r in [r0, r1), i in [0, n).
void tiled_matmul(const TileSet& tiles, const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* x,
                  int64_t x_stride, int64_t n, float* y, int64_t y_stride);

// The float prefill panels (matmul_avx512.cpp, matmul_avx2.cpp): per column block of up to
// max_cols, every tile of tile_tokens tokens is packed once (k-major), then each group of
// group_rows rows is packed (widened, k-major) and multiplied with every token tile. Each ISA
// supplies the three steps; this is the loop nest they share.
struct PanelKernels {
  int group_rows = 0;
  int tile_tokens = 0;
  int64_t max_cols = 0;   // a group's panel over this many columns fits the ISA's L2 budget
  int64_t col_align = 1;  // column blocks are multiples of this
  // Tokens [t0, t0 + nt) over columns [k0, k0 + kk) into out[c * tile_tokens + t], zero past nt.
  void (*pack_tokens)(const float* x, int64_t x_stride, int64_t t0, int nt, int64_t k0, int64_t kk, float* out);
  // Rows [row, row + nr) over columns [k0, k0 + kk) into panel[c * group_rows + r], zero past nr.
  void (*pack_weights)(const WeightMatrix& w, int64_t row, int nr, int64_t k0, int64_t kk, float* panel);
  // y[t * y_stride + r] (+)= sum_c panel[c][r] * tile[c][t] for r < nr, t < nt.
  void (*multiply)(const float* panel, const float* tile, int64_t kk, float* y, int64_t y_stride, int nr, int nt,
                   bool accumulate);
};

// y[i * y_stride + r] = W(r, :) . x_i for r in [r0, r1), i in [0, n); w.cols > 0.
void panel_matmul(const PanelKernels& k, const WeightMatrix& w, int64_t r0, int64_t r1, const float* x,
                  int64_t x_stride, int64_t n, float* y, int64_t y_stride);

template <template <int, int> class Kernel, int R, int... Ts>
void fill_tile_row(TileSet& set, std::integer_sequence<int, Ts...>) {
  ((set.fn[R - 1][Ts] = &Kernel<R, Ts + 1>::run), ...);
}

template <template <int, int> class Kernel, int MaxT, int... Rs>
void fill_tile_rows(TileSet& set, std::integer_sequence<int, Rs...>) {
  (fill_tile_row<Kernel, Rs + 1>(set, std::make_integer_sequence<int, MaxT>{}), ...);
}

// Fills set.fn with Kernel<R, T>::run for R in [1, MaxR], T in [1, MaxT]: call from an ISA's file
// with its own microkernel template (instantiated there, under its target options).
template <template <int, int> class Kernel, int MaxR, int MaxT>
void fill_tiles(TileSet& set) {
  static_assert(MaxR <= TileSet::kMaxRows && MaxT <= TileSet::kMaxTokens);
  set.rows = MaxR;
  set.tokens = MaxT;
  fill_tile_rows<Kernel, MaxT>(set, std::make_integer_sequence<int, MaxR>{});
}

}  // namespace tandem::cpu
