#include "kernels/cpu/tiled_matmul.h"

#include <algorithm>

#include "kernels/cpu/isa_kernels.h"

namespace tandem::cpu {

namespace {

// Sizes chosen for the smallest caches still common on x86-64 servers: 32 KiB L1d, 512 KiB+ L2.
constexpr int64_t kTokenTileBytes = 20 << 10;   // one token tile's activations over a column chunk: L1
constexpr int64_t kRowBlockBytes = 256 << 10;   // a block of rows' weights over a column chunk: L2

// Up to this many tokens (batched decode) the weights stream from DRAM once, tile by tile, with
// software prefetch; each row tile then serves every token tile from L1/L2. The prefill loop nest
// below has no prefetch and lost 5x on 8 tokens of Q4 (whose token tile is 3).
constexpr int64_t kStreamMaxTokens = 15;

int64_t round_down(int64_t v, int64_t m) { return v / m * m; }

}  // namespace

void tiled_matmul(const TileSet& tiles, const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* x,
                  int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  if (r0 >= r1 || n <= 0) return;
  const int64_t K = w.cols;
  if (K == 0) {
    for (int64_t i = 0; i < n; ++i) std::fill(y + i * y_stride + r0, y + i * y_stride + r1, 0.0f);
    return;
  }
  const int R = tiles.rows, T = tiles.tokens;
  if (n <= std::max<int64_t>(2 * T, kStreamMaxTokens)) {
    // Decode: every row streams from DRAM once, over all columns, for all tokens.
    for (int64_t r = r0; r < r1; r += R) {
      const int rr = int(std::min<int64_t>(R, r1 - r));
      for (int64_t t = 0; t < n; t += T) {
        const int tt = int(std::min<int64_t>(T, n - t));
        tiles.fn[rr - 1][tt - 1](w, r, x + t * x_stride, x_stride, 0, K, y + t * y_stride, y_stride, false, true);
      }
    }
    return;
  }
  // Prefill: a token tile's activations over a column chunk stay in L1 while the weights of a
  // block of rows (in L2) pass under them; every weight comes from DRAM once, the activations
  // from L2/L3 once per row block.
  int64_t kc = std::max(tiles.k_align, round_down(kTokenTileBytes / (T * tiles.x_bytes_per_col), tiles.k_align));
  if (kc >= K) kc = K;
  const int64_t chunk_row_bytes = std::max<int64_t>(1, row_bytes(w.format, kc));
  const int64_t mb = std::max<int64_t>(R, round_down(kRowBlockBytes / chunk_row_bytes, R));
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t k1 = std::min(K, k0 + kc);
    const bool accumulate = k0 > 0;
    for (int64_t b0 = r0; b0 < r1; b0 += mb) {
      const int64_t b1 = std::min(r1, b0 + mb);
      for (int64_t t = 0; t < n; t += T) {
        const int tt = int(std::min<int64_t>(T, n - t));
        for (int64_t r = b0; r < b1; r += R) {
          const int rr = int(std::min<int64_t>(R, b1 - r));
          tiles.fn[rr - 1][tt - 1](w, r, x + t * x_stride, x_stride, k0, k1, y + t * y_stride, y_stride, accumulate,
                                   false);
        }
      }
    }
  }
}

void panel_matmul(const PanelKernels& k, const WeightMatrix& w, int64_t r0, int64_t r1, const float* x,
                  int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  const int64_t K = w.cols;
  const int64_t blocks = (K + k.max_cols - 1) / k.max_cols;
  const int64_t kc = std::min(K, ((K + blocks - 1) / blocks + k.col_align - 1) / k.col_align * k.col_align);
  const int64_t token_tiles = (n + k.tile_tokens - 1) / k.tile_tokens;
  const int64_t tile_floats = kc * k.tile_tokens;
  float* tiles = detail::thread_scratch_floats(0, size_t(token_tiles * tile_floats));
  float* panel = detail::thread_scratch_floats(1, size_t(kc * k.group_rows));
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t kk = std::min(kc, K - k0);
    // Every token tile over this column block, read by every row group below.
    for (int64_t i = 0; i < token_tiles; ++i) {
      const int nt = int(std::min<int64_t>(k.tile_tokens, n - i * k.tile_tokens));
      k.pack_tokens(x, x_stride, i * k.tile_tokens, nt, k0, kk, tiles + i * tile_floats);
    }
    for (int64_t g = r0; g < r1; g += k.group_rows) {
      const int nr = int(std::min<int64_t>(k.group_rows, r1 - g));
      k.pack_weights(w, g, nr, k0, kk, panel);
      for (int64_t i = 0; i < token_tiles; ++i) {
        const int nt = int(std::min<int64_t>(k.tile_tokens, n - i * k.tile_tokens));
        k.multiply(panel, tiles + i * tile_floats, kk, y + i * k.tile_tokens * y_stride + g, y_stride, nr, nt, k0 > 0);
      }
    }
  }
}

}  // namespace tandem::cpu
