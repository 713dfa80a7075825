#pragma once
// The register-tile machinery and the blocking loop of the AVX2 prefill panels for Q8/Q4
// (matmul_avx2_quant_panel.cpp, read that first), shared with matmul_avxvnni_panel.cpp. Each file
// defines its tiles, Tile<R, T> with
//   template <bool First> static void chunk(wc, prb, xc, x_stride, sums)
// (one 256-column chunk of R panel rows x T tokens into their float sums; First stores them), and
// passes them to panel_matmul. Include it as avx2_quant_helpers.h, inside the file's target pragma
// after every standard header and isa_kernels.h: the templates compile for that file's
// instruction set and stay in its anonymous namespace.

namespace tandem::cpu::detail {

namespace {

constexpr int64_t kChunk = 256, kChunkBlocks = 8;
constexpr int64_t kWeightChunkBytes = 288;
// A 3-token tile's activations over a block of columns fit in kTokenTileBytes (L1). The blocks are
// sized for 3 tokens whatever the tile's width, so that the AVX2 tiles (3 tokens) and the AVX-VNNI
// ones (4 tokens, 22 KB per block, still within a 32 KB L1) add a dot product's column blocks
// alike and give the same results to the bit.
constexpr int64_t kTokenTileBytes = 16 << 10, kColumnBlockTokens = 3;
constexpr int64_t kPanelBytes = 192 << 10;     // the packed weights of a block of rows: L2

inline int64_t chunk_count(int64_t cols) { return (cols + kChunk - 1) / kChunk; }

// Where 256-column chunk c of a token's activations starts.
inline const uint8_t* activation_chunk(const uint8_t* x, int64_t c) {
  return x + c / 2 * kActivationChunkBytes + c % 2 * 32;
}

// x: the token tile's activations from column 0; the tile reads chunks [first_chunk, + chunks).
using PanelTileFn = void (*)(const uint8_t* panel, int64_t panel_row_bytes, const uint8_t* x, int64_t x_stride,
                             int64_t first_chunk, int64_t chunks, float* y, int64_t y_stride, bool accumulate);

// One chunk's 8 block sums of one dot product, scaled and added to its float sums; the first chunk
// of a tile call stores instead.
template <bool First>
void add_block_sums(float* sums, __m256i block_sums, __m256 scales) {
  const __m256 v = _mm256_cvtepi32_ps(block_sums);
  _mm256_store_ps(sums, First ? _mm256_mul_ps(v, scales) : _mm256_fmadd_ps(v, scales, _mm256_load_ps(sums)));
}

// A chunk's int32 block sums of R rows x T tokens, scaled by weight x token scales into the float
// sums of each dot product.
template <bool First, int R, int T>
void scale_chunk(const uint8_t* wc, int64_t prb, const uint8_t* xc, int64_t x_stride, const __m256i (&acc)[R][T],
                 float* sums) {
  __m256 dx[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t)
    dx[t] = _mm256_load_ps(reinterpret_cast<const float*>(xc + t * x_stride + kActivationScales));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 dw = _mm256_load_ps(reinterpret_cast<const float*>(wc + r * prb + 256));
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) add_block_sums<First>(sums + 8 * (r * T + t), acc[r][t], _mm256_mul_ps(dw, dx[t]));
  }
}

template <template <int, int> class Tile, int R, int T>
void run_tile(const uint8_t* panel, int64_t prb, const uint8_t* x, int64_t x_stride, int64_t first_chunk,
              int64_t chunks, float* y, int64_t y_stride, bool accumulate) {
  alignas(32) float sums[R * T * 8];
  Tile<R, T>::template chunk<true>(panel, prb, activation_chunk(x, first_chunk), x_stride, sums);
  for (int64_t ch = 1; ch < chunks; ++ch)
    Tile<R, T>::template chunk<false>(panel + ch * kWeightChunkBytes, prb, activation_chunk(x, first_chunk + ch),
                                      x_stride, sums);
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) {
      const float total = hsum(_mm256_load_ps(sums + 8 * (r * T + t)));
      float* out = y + t * y_stride + r;
      *out = accumulate ? *out + total : total;
    }
}

// Every tile of up to Rows x Tokens: fn[r - 1][t - 1] runs r rows x t tokens.
template <int Rows, int Tokens>
struct PanelTiles {
  static constexpr int kRows = Rows, kTokens = Tokens;
  PanelTileFn fn[Rows][Tokens];
};

template <template <int, int> class Tile, int Rows, int Tokens, int R, int... Ts>
void fill_panel_row(PanelTiles<Rows, Tokens>& tiles, std::integer_sequence<int, Ts...>) {
  ((tiles.fn[R - 1][Ts] = &run_tile<Tile, R, Ts + 1>), ...);
}

template <template <int, int> class Tile, int Rows, int Tokens, int... Rs>
void fill_panel_tiles(PanelTiles<Rows, Tokens>& tiles, std::integer_sequence<int, Rs...>) {
  (fill_panel_row<Tile, Rows, Tokens, Rs + 1>(tiles, std::make_integer_sequence<int, Tokens>{}), ...);
}

template <template <int, int> class Tile, int Rows, int Tokens>
PanelTiles<Rows, Tokens> make_panel_tiles() {
  PanelTiles<Rows, Tokens> tiles{};
  fill_panel_tiles<Tile>(tiles, std::make_integer_sequence<int, Rows>{});
  return tiles;
}

// The panel: 64-byte aligned, grow-only, one per thread (the float panels use slots 0 and 1).
inline uint8_t* panel_buffer(size_t bytes) {
  return reinterpret_cast<uint8_t*>(thread_scratch_floats(2, (bytes + 3) / 4));
}

inline int64_t round_down(int64_t v, int64_t m) { return v / m * m; }

// Rows [r0, r1) of w times n tokens (panel layout, xq) through the tiles: a block of rows packed at
// a time (avx2_pack_quant_panel, Q8 codes as q + 128 if q8_offset), every token tile over it.
template <int Rows, int Tokens>
void panel_matmul(const PanelTiles<Rows, Tokens>& tiles, bool q8_offset, const WeightMatrix& w, int64_t r0, int64_t r1,
                  const uint8_t* xq, int64_t xq_stride, int64_t n, float* y, int64_t y_stride) {
  if (r0 >= r1 || n <= 0) return;
  const int64_t chunks = chunk_count(w.cols);
  const int64_t kcc =
      std::clamp<int64_t>(kTokenTileBytes / (kColumnBlockTokens * kActivationChunkBytes / 2), 1, chunks);
  const int64_t mb = std::max<int64_t>(Rows, round_down(kPanelBytes / (kcc * kWeightChunkBytes), Rows));
  uint8_t* panel = panel_buffer(size_t(std::min(mb, r1 - r0) * kcc * kWeightChunkBytes));
  for (int64_t ch0 = 0; ch0 < chunks; ch0 += kcc) {
    const int64_t nc = std::min(kcc, chunks - ch0);
    const int64_t prb = nc * kWeightChunkBytes;
    for (int64_t b0 = r0; b0 < r1; b0 += mb) {
      const int64_t b1 = std::min(r1, b0 + mb);
      avx2_pack_quant_panel(w, b0, b1, ch0, nc, panel, q8_offset);
      for (int64_t t = 0; t < n; t += Tokens) {
        const int tt = int(std::min<int64_t>(Tokens, n - t));
        const uint8_t* xt = xq + t * xq_stride;
        for (int64_t r = b0; r < b1; r += Rows) {
          const int rr = int(std::min<int64_t>(Rows, b1 - r));
          tiles.fn[rr - 1][tt - 1](panel + (r - b0) * prb, prb, xt, xq_stride, ch0, nc, y + t * y_stride + r,
                                   y_stride, ch0 > 0);
        }
      }
    }
  }
}

}  // namespace

}  // namespace tandem::cpu::detail
