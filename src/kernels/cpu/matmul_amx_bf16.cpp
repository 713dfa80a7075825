// AMX matmul for BF16 weights in row groups (WeightLayout::Interleaved), for 2 tokens or more:
// batches of up to 16 straight from the row groups, prefill (more) from packed 16-row tiles
// (prefill() below). The AVX-512 FMA tiles run batches of 8 at ~0.85 FMA per cycle while
// streaming, so a batch of 8 sat at 3-4x one token's speed, and bf16 prefill at ~180 GFLOP/s per
// core; one tile dot product (tdpbf16ps) does up to 8192 multiply-adds.
//
// Exactness. The tiles multiply bf16 by bf16, and the activations are float32, so each activation
// is split into three bf16 parts, x = hi + mid + lo, each the top 16 bits of what the parts
// before it left (truncation: every remainder is exact in float32, and 3 x 8 significant bits
// hold all 24 of a float's). The products of bf16 weights and bf16 parts are exact in float32, so
// the results are float32 sums of exact products, as the FMA kernels' are: only the order (and
// that three products stand for one) differs. The tiles flush denormals to zero, so activations
// below ~1e-33 (whose low part is denormal) lose their last bits; an infinite activation gives NaN
// (inf - inf in the split), where an FMA kernel gives inf or NaN. One bf16 part would lose 16 bits
// of every activation.
//
// Batches. A weight row group (4 rows) of one 32-column chunk is 256 contiguous bytes, so a 4-row
// tile loads it straight from the resident weights (stride 64), with no packing. The activations
// are packed once per matmul (matmul() does it before its pass over the threads) into the tiles'
// pair layout: per chunk, T tiles of 16 rows (column pairs) by 16 columns, the three parts of
// every token side by side (column p * n + t: part p of token t), so T = ceil(3n / 16), each
// with a result tile of its own; a token's three sums are added at the end. Prefill's token
// tiles are laid out as batches of 16 (tile p: part p of every token).
//
// Speed (a Xeon with AMX, one core): a 4-row tdpbf16ps takes ~4.3 ns when its activation tile
// differs from the previous product's and ~2.7 ns when two row groups take turns on one
// activation tile, whatever the token count, and loading 16-row activation tiles from L2 bounded
// the first version at 12 GB/s of weights. So two row groups go side by side, each activation tile
// serves both, and the weights go through in blocks of chunks whose activation tiles stay in L1.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <utility>

#include "kernels/cpu/isa_kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c,amx-tile,amx-bf16")
// GCC 12 flags the intrinsic headers' own _mm512_undefined_*() placeholders as uninitialized.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace tandem::cpu::detail {

namespace {

constexpr int kParts = 3;           // hi, mid, lo
constexpr int64_t kChunkCols = 32;  // one 64-byte vector of bf16: a row group's chunk in the layout
constexpr int64_t kPairRows = kChunkCols / 2;
constexpr int64_t kTileCols = 16;
constexpr int64_t kTileBytes = kPairRows * 4 * kTileCols;
constexpr int64_t kTokenTile = 16;  // tokens of a batch (at most) and of a prefill token tile
// Row segments side by side, for up to 10 tokens (T <= 2); one for more (T = 3: 3 result tiles,
// 1 weight tile, 3 activation tiles).
constexpr int kSegmentsSideBySide = 2;
// Activation tiles a block of chunks keeps in L1 (T KB per chunk). Batch8/bf16i on two cores:
// 8-12 KB 22-24 GB/s, 16-24 KB 20-22, 48 KB 13-16; prefetching blocks further ahead into L2 was
// slower.
constexpr int64_t kBlockBytes = 12 << 10;
// Segments whose products wait for the blocks of a row together (their sums between blocks stay
// in L1).
constexpr int kMaxSegments = 8;

// Tile register numbers are part of the instruction, so these take them as template arguments.
template <int Tile>
void tile_load(const void* base, int64_t stride) {
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm%c2" ::"r"(base), "r"(stride), "i"(Tile) : "memory");
}
template <int Tile>
void tile_store(void* base, int64_t stride) {
  __asm__ volatile("tilestored %%tmm%c2, (%0,%1,1)" ::"r"(base), "r"(stride), "i"(Tile) : "memory");
}
template <int Tile>
void tile_zero() {
  __asm__ volatile("tilezero %%tmm%c0" ::"i"(Tile));
}
template <int Sums, int Weights, int Activations>
void tile_dot() {
  __asm__ volatile("tdpbf16ps %%tmm%c2, %%tmm%c1, %%tmm%c0" ::"i"(Sums), "i"(Weights), "i"(Activations));
}
template <int N, class F>
void for_each_index(F&& f) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (f.template operator()<I>(), ...);
  }(std::make_integer_sequence<int, N>{});
}

// How n tokens' activation parts sit in a chunk's T tiles: part p of token t in column p * n + t
// (tile = column / 16).
struct PartLayout {
  int64_t n, tiles;
  explicit PartLayout(int64_t tokens) : n(tokens), tiles((kParts * tokens + kTileCols - 1) / kTileCols) {}
  int64_t column(int p, int64_t t) const { return p * n + t; }
};

// The 32 floats of a chunk as three bf16 parts that add up to them exactly (truncation: each part
// is the top 16 bits of what the parts before it left, and every remainder is exact), each part's
// 32 bf16 in column order: 16 column pairs.
void split_chunk(const float* values, __m512i (&parts)[kParts]) {
  // The high halves of two vectors of 16 floats: 32 bf16 in column order.
  const __m512i high_halves =
      _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19, 17,
                       15, 13, 11, 9, 7, 5, 3, 1);
  const __m512i top_bits = _mm512_set1_epi32(int(0xffff0000u));
  __m512 a = _mm512_loadu_ps(values), b = _mm512_loadu_ps(values + 16);
  for (int p = 0; p < kParts; ++p) {
    const __m512i ha = _mm512_and_si512(_mm512_castps_si512(a), top_bits);
    const __m512i hb = _mm512_and_si512(_mm512_castps_si512(b), top_bits);
    parts[p] = _mm512_permutex2var_epi16(ha, high_halves, hb);
    a = _mm512_sub_ps(a, _mm512_castsi512_ps(ha));
    b = _mm512_sub_ps(b, _mm512_castsi512_ps(hb));
  }
}

// Result tiles: one per group and activation tile; weight tiles follow, then activation tiles.
// A single segment takes the first group's tiles.
template <int T>
struct Tiles {
  static constexpr int kSegments = T <= 2 ? kSegmentsSideBySide : 1;  // side by side at this T
  static constexpr int kSums = kSegments * T;
  static constexpr int kWeights = kSums;
  static constexpr int kActivations = kSums + kSegments;
  static_assert(kActivations + T <= 8, "8 tile registers");
  static constexpr int sums(int g, int k) { return g * T + k; }
};

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles below the first activation tile have the segment's rows; from there on 16 pair rows. All
// rows are 64 bytes: 16 floats of sums, 32 bf16 weights, 16 columns of pairs.
TileConfig make_config(int64_t rows, int first_activation_tile) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = uint8_t(t < first_activation_tile ? rows : kPairRows);
    c.colsb[t] = 64;
  }
  return c;
}

// The configs for segments of 1-4 rows, by the first activation tile (T = 1 and 3 both start at 4).
const TileConfig& tile_config(int64_t rows, int first_activation_tile) {
  struct Configs {
    TileConfig by_rows[8][4];
    Configs() {
      for (int a = 0; a < 8; ++a)
        for (int r = 1; r <= 4; ++r) by_rows[a][r - 1] = make_config(r, a);
    }
  };
  static const Configs configs;
  return configs.by_rows[first_activation_tile][rows - 1];
}

// A row segment: rows of one row group (a range may start or end inside a group), chunk c of its
// rows at w + c * step.
struct Segment {
  int64_t row, rows;
  const uint8_t* w;
  int64_t step;
};

// Where the products of G segments over chunks [c0, c1) go. The G streams at `ahead` (ahead_stride
// bytes apart, ahead_step bytes a chunk: what the pass reads after this block) are prefetched as
// the block is read.
struct Block {
  int64_t c0, c1;
  const uint8_t* ahead;
  int64_t ahead_stride, ahead_step;
};

template <int G, int T>
void add_products(const Segment* s, const Block& b, const uint8_t* xp) {
  using Registers = Tiles<T>;
  for (int64_t c = b.c0; c < b.c1; ++c) {
    const uint8_t* tiles = xp + c * T * kTileBytes;
    for (int g = 0; g < G; ++g)
      for (int64_t line = 0; line < b.ahead_step; line += 64)
        _mm_prefetch((const char*)b.ahead + g * b.ahead_stride + (c - b.c0) * b.ahead_step + line, _MM_HINT_T0);
    for_each_index<T>([&]<int K>() { tile_load<Registers::kActivations + K>(tiles + K * kTileBytes, 64); });
    for_each_index<G>([&]<int Gi>() { tile_load<Registers::kWeights + Gi>(s[Gi].w + c * s[Gi].step, 64); });
    // Each activation tile serves every group before the next one comes.
    for_each_index<T>([&]<int K>() {
      for_each_index<G>([&]<int Gi>() {
        tile_dot<Registers::sums(Gi, K), Registers::kWeights + Gi, Registers::kActivations + K>();
      });
    });
  }
}

// G segments' sums (the result tiles of each, 16 floats a row) to or from memory, or cleared.
template <int G, int T>
void load_sums(float (*sums)[kParts][kInterleaveRows * kTileCols], bool clear) {
  using Registers = Tiles<T>;
  for_each_index<G>([&]<int Gi>() {
    for_each_index<T>([&]<int K>() {
      if (clear) tile_zero<Registers::sums(Gi, K)>();
      else tile_load<Registers::sums(Gi, K)>(sums[Gi][K], 64);
    });
  });
}
template <int G, int T>
void store_sums(float (*sums)[kParts][kInterleaveRows * kTileCols]) {
  using Registers = Tiles<T>;
  for_each_index<G>([&]<int Gi>() {
    for_each_index<T>([&]<int K>() { tile_store<Registers::sums(Gi, K)>(sums[Gi][K], 64); });
  });
}

// G segments over one block of chunks, their sums from and back to memory (cleared on the first).
template <int G, int T>
void multiply_block(const Segment* s, const Block& b, const uint8_t* xp,
                    float (*sums)[kParts][kInterleaveRows * kTileCols]) {
  load_sums<G, T>(sums, b.c0 == 0);
  add_products<G, T>(s, b, xp);
  store_sums<G, T>(sums);
}

// One pass of up to kMaxSegments segments over every chunk, block by block, G at a time.
template <int T>
void segments_pass(const Segment* segments, int count, int64_t chunks, const uint8_t* xp,
                   float (*sums)[kParts][kInterleaveRows * kTileCols], int64_t& configured) {
  constexpr int kActivations = Tiles<T>::kActivations;
  const int64_t block_chunks = std::max<int64_t>(1, kBlockBytes / (T * kTileBytes));
  for (int64_t c0 = 0; c0 < chunks; c0 += block_chunks) {
    const int64_t c1 = std::min(chunks, c0 + block_chunks);
    for (int i = 0; i < count;) {
      // Two segments side by side when they are whole groups that follow each other.
      const bool pair = Tiles<T>::kSegments == 2 && i + 1 < count &&
                        segments[i].rows == kInterleaveRows && segments[i + 1].rows == kInterleaveRows;
      const int g = pair ? 2 : 1;
      const int64_t key = segments[i].rows * 8 + kActivations;
      if (key != configured) _tile_loadconfig(&tile_config(segments[i].rows, kActivations));
      configured = key;
      // What comes next: the next segments' block, or the first segments' next block.
      const Segment& next = i + g < count ? segments[i + g] : segments[0];
      const Block b{c0, c1, next.w + (i + g < count ? c0 : std::min(c1, chunks - 1)) * next.step,
                    next.step * chunks, next.step};
      if constexpr (Tiles<T>::kSegments == 2) {
        if (pair) multiply_block<2, T>(segments + i, b, xp, sums + i);
        else multiply_block<1, T>(segments + i, b, xp, sums + i);
      } else {
        multiply_block<1, T>(segments + i, b, xp, sums + i);
      }
      i += g;
    }
  }
}

// A segment's sums into y's columns row0.. for n tokens, the parts added hi + mid, then + lo.
void store_results(const float (&sums)[kParts][kInterleaveRows * kTileCols], const PartLayout& layout,
                   int64_t rows, int64_t row0, int64_t n, float* y, int64_t y_stride) {
  for (int64_t t = 0; t < n; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      float part[kParts];
      for (int p = 0; p < kParts; ++p) {
        const int64_t j = layout.column(p, t);
        part[p] = sums[j / kTileCols][r * kTileCols + j % kTileCols];
      }
      y[t * y_stride + row0 + r] = (part[0] + part[1]) + part[2];
    }
}

// Prefill: more than 16 tokens, in tiles of 16 (the activations are laid out as batches of 16,
// three tiles a chunk, one per part). The weights are packed into 16-row tiles, 1 KB a chunk, so
// each product is a 16-row one (~4.3 ns for 16 x 16 x 32 multiply-adds against ~2.7 ns for a 4-row
// one), and all three parts add into one result tile per 16 rows and 16 tokens. Loops, GEMM
// fashion, so that what each product reads comes from L1 or L2: token blocks of up to
// kPrefillTokenTiles tiles; within them row blocks of up to kPrefillRowTiles row tiles, whose
// weights are packed kPrefillBlockChunks chunks at a time (128 KB); within each of those, every
// token tile's activation tiles of the block (24 KB) serve all the row tiles, two at a time. The
// sums wait in memory between blocks of chunks (512 KB). One core, kernels_bench Prefill/bf16i:
// token blocks of 32 tiles 310-390 GFLOP/s against 290-330 for 16; blocks of 4 or 16 chunks and
// row blocks of 8 or 32 tiles were no faster.
constexpr int64_t kPrefillTokenTiles = 32, kPrefillRowTiles = 16, kPrefillBlockChunks = 8;
constexpr int64_t kRowTileRows = 16, kRowTileBytes = kRowTileRows * 64;  // 16 rows of 32 bf16

int64_t token_tiles(int64_t n) { return (n + kTokenTile - 1) / kTokenTile; }

// Rows [row0, row1) of w, chunks [c0, c0 + count) into 16-row tiles (tile i of chunk c at
// packed + (i * kPrefillBlockChunks + c - c0) * 1 KB); rows past row1 up to `tiles` tiles are zero.
void pack_row_tiles(const WeightMatrix& w, int64_t row0, int64_t row1, int64_t tiles, int64_t c0, int64_t count,
                    uint8_t* packed) {
  for (int64_t i = 0; i < tiles; ++i)
    for (int64_t c = c0; c < c0 + count; ++c) {
      uint8_t* tile = packed + (i * kPrefillBlockChunks + c - c0) * kRowTileBytes;
      for (int64_t r = 0; r < kRowTileRows; ++r) {
        const int64_t row = row0 + i * kRowTileRows + r;
        const __m512i v = row < row1 ? _mm512_loadu_si512(interleaved_vector(w, row, c, 0)) : _mm512_setzero_si512();
        _mm512_store_si512(tile + 64 * r, v);
      }
    }
}

// 16 rows of 16 floats (64 bytes apart) into its 16 columns: at block sizes 8, 4, 2 and 1, each
// pair of rows (i, i + b) swaps the top-right and bottom-left b x b blocks of their 2b x 2b ones.
void transpose_16x16(const float* rows, __m512 (&columns)[16]) {
  struct Indices {
    __m512i low[4], high[4];  // per stage: row i's new elements, row i + b's
    Indices() {
      for (int s = 0; s < 4; ++s) {
        const int b = 8 >> s;
        alignas(64) int32_t lo[16], hi[16];
        for (int c = 0; c < 16; ++c) {
          lo[c] = (c & b) ? 16 + c - b : c;
          hi[c] = (c & b) ? 16 + c : c + b;
        }
        low[s] = _mm512_load_si512(lo);
        high[s] = _mm512_load_si512(hi);
      }
    }
  };
  static const Indices indices;
  for (int i = 0; i < 16; ++i) columns[i] = _mm512_loadu_ps(rows + 16 * i);
  for (int s = 0; s < 4; ++s) {
    const int b = 8 >> s;
    for (int i = 0; i < 16; ++i) {
      if (i & b) continue;
      const __m512 a = columns[i], c = columns[i + b];
      columns[i] = _mm512_permutex2var_ps(a, indices.low[s], c);
      columns[i + b] = _mm512_permutex2var_ps(a, indices.high[s], c);
    }
  }
}

TileConfig prefill_config() {
  TileConfig c;
  for (int t = 0; t < 7; ++t) {
    c.rows[t] = kRowTileRows;  // 16 rows of weights, of sums, and 16 pair rows of activations
    c.colsb[t] = 64;
  }
  return c;
}

void prefill(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xp, int64_t n, float* y,
             int64_t y_stride) {
  static const TileConfig config = prefill_config();
  const int64_t chunks = w.cols / kChunkCols, tiles_of_tokens = token_tiles(n);
  const int64_t token_tile_bytes = chunks * kParts * kTileBytes, tile_floats = kRowTileRows * kTileCols;
  auto* packed = reinterpret_cast<uint8_t*>(
      thread_scratch_floats(0, size_t(kPrefillRowTiles * kPrefillBlockChunks * kRowTileBytes / 4)));
  float* sums = thread_scratch_floats(1, size_t(kPrefillRowTiles * kPrefillTokenTiles * tile_floats));
  _tile_loadconfig(&config);
  for (int64_t tb0 = 0; tb0 < tiles_of_tokens; tb0 += kPrefillTokenTiles) {
    const int64_t tb1 = std::min(tiles_of_tokens, tb0 + kPrefillTokenTiles);
    for (int64_t rb0 = r0; rb0 < r1; rb0 += kPrefillRowTiles * kRowTileRows) {
      const int64_t rb1 = std::min(r1, rb0 + kPrefillRowTiles * kRowTileRows);
      const int64_t row_tiles = ((rb1 - rb0 + kRowTileRows - 1) / kRowTileRows + 1) / 2 * 2;  // whole pairs
      auto tile_sums = [&](int64_t rt, int64_t tt) {
        return sums + (rt * kPrefillTokenTiles + tt - tb0) * tile_floats;
      };
      for (int64_t c0 = 0; c0 < chunks; c0 += kPrefillBlockChunks) {
        const int64_t count = std::min(kPrefillBlockChunks, chunks - c0);
        pack_row_tiles(w, rb0, rb1, row_tiles, c0, count, packed);
        // The next block's weights come into L2 while this one is multiplied (the packing waited
        // on DRAM): a row group's chunks of a block are contiguous, one group per token tile.
        const bool last_block = c0 + count >= chunks;
        const int64_t next_row0 = last_block ? rb1 : rb0;
        const int64_t next_row1 = last_block ? std::min(r1, rb1 + (rb1 - rb0)) : rb1;
        const int64_t next_c0 = last_block ? 0 : c0 + count;
        const int64_t next_count = std::min(kPrefillBlockChunks, chunks - next_c0);
        const int64_t next_groups = (next_row1 - next_row0 + kInterleaveRows - 1) / kInterleaveRows;
        const int64_t groups_per_tile = (next_groups + (tb1 - tb0) - 1) / (tb1 - tb0);
        for (int64_t tt = tb0; tt < tb1; ++tt) {
          const int64_t g1 = std::min(next_groups, (tt - tb0 + 1) * groups_per_tile);
          for (int64_t g = (tt - tb0) * groups_per_tile; g < g1; ++g) {
            const int64_t row = next_row0 + g * kInterleaveRows;
            const uint8_t* first = interleaved_vector(w, row - row % kInterleaveRows, next_c0, 0);
            const auto* group = reinterpret_cast<const char*>(first);
            const int64_t bytes = next_count * 64 * interleaved_group_rows(w, row);
            for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(group + b, _MM_HINT_T1);
          }
          const uint8_t* activations = xp + tt * token_tile_bytes + c0 * kParts * kTileBytes;
          for (int64_t rt = 0; rt < row_tiles; rt += 2) {
            if (c0 == 0) {
              tile_zero<0>();
              tile_zero<1>();
            } else {
              tile_load<0>(tile_sums(rt, tt), 64);
              tile_load<1>(tile_sums(rt + 1, tt), 64);
            }
            const uint8_t* weights = packed + rt * kPrefillBlockChunks * kRowTileBytes;
            for (int64_t c = 0; c < count; ++c) {
              const uint8_t* parts = activations + c * kParts * kTileBytes;
              tile_load<2>(weights + c * kRowTileBytes, 64);
              tile_load<3>(weights + (kPrefillBlockChunks + c) * kRowTileBytes, 64);
              tile_load<4>(parts, 64);
              tile_load<5>(parts + kTileBytes, 64);
              tile_load<6>(parts + 2 * kTileBytes, 64);
              tile_dot<0, 2, 4>();
              tile_dot<1, 3, 4>();
              tile_dot<0, 2, 5>();
              tile_dot<1, 3, 5>();
              tile_dot<0, 2, 6>();
              tile_dot<1, 3, 6>();
            }
            tile_store<0>(tile_sums(rt, tt), 64);
            tile_store<1>(tile_sums(rt + 1, tt), 64);
          }
        }
      }
      // Row r of tile rt, token j of tile tt, into y's row of token j.
      for (int64_t rt = 0; rt * kRowTileRows < rb1 - rb0; ++rt)
        for (int64_t tt = tb0; tt < tb1; ++tt) {
          __m512 by_token[kTileCols];
          transpose_16x16(tile_sums(rt, tt), by_token);
          const __mmask16 rows = __mmask16((1u << std::min(kRowTileRows, rb1 - rb0 - rt * kRowTileRows)) - 1);
          const int64_t tokens = std::min(kTokenTile, n - tt * kTokenTile);
          for (int64_t j = 0; j < tokens; ++j)
            _mm512_mask_storeu_ps(y + (tt * kTokenTile + j) * y_stride + rb0 + rt * kRowTileRows, rows, by_token[j]);
        }
    }
  }
  _tile_release();
}

}  // namespace

bool amx_bf16_multiplies(const WeightMatrix& w, int64_t n) {
  return w.format == WeightFormat::BF16 && w.layout == WeightLayout::Interleaved && n >= 2 && w.cols % kChunkCols == 0;
}

int64_t amx_bf16_activation_stride(const WeightMatrix& w, int64_t n) {
  // The packed tiles are not per token; n tokens' strides cover them all.
  const int64_t total = token_tiles(n) * w.cols / kChunkCols * PartLayout(std::min(n, kTokenTile)).tiles * kTileBytes;
  return (total + n * 64 - 1) / (n * 64) * 64;
}

void amx_bf16_prepare_activations(const WeightMatrix& w, int64_t n, const float* x, int64_t x_stride, int64_t first,
                                  int64_t count, uint8_t* out, int64_t /*out_stride*/) {
  // More than 16 tokens: tiles of 16, each laid out as a batch of 16, one after the other.
  const PartLayout layout(std::min(n, kTokenTile));
  const int64_t chunks = w.cols / kChunkCols, chunk_bytes = layout.tiles * kTileBytes;
  const int64_t token_tile_bytes = chunks * chunk_bytes;
  // Pair q of a column goes to row q of its tile.
  const __m512i pair_rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(4 * kTileCols));
  // Column j of token tile `tile`.
  auto column_at = [&](int64_t tile, int64_t j) {
    return out + tile * token_tile_bytes + j / kTileCols * kTileBytes + 4 * (j % kTileCols);
  };
  int64_t t = first;
  const int64_t end = first + count;
  auto one_token = [&](int64_t token) {
    const float* xt = x + token * x_stride;
    uint8_t* part_column[kParts];
    for (int p = 0; p < kParts; ++p)
      part_column[p] = column_at(token / kTokenTile, layout.column(p, token % kTokenTile));
    for (int64_t c = 0; c < chunks; ++c) {
      __m512i parts[kParts];
      split_chunk(xt + kChunkCols * c, parts);
      for (int p = 0; p < kParts; ++p)
        _mm512_i32scatter_epi32(part_column[p] + c * chunk_bytes, pair_rows, parts[p], 1);
    }
  };
  if (n > kTokenTile) {
    // Whole token tiles: a part's 16 token vectors of a chunk, transposed, are its tile's rows.
    for (; t < end && t % kTokenTile != 0; ++t) one_token(t);
    alignas(64) int32_t by_token[kParts][kTokenTile][kTileCols];
    for (; t + kTokenTile <= end; t += kTokenTile) {
      uint8_t* tile = out + t / kTokenTile * token_tile_bytes;
      for (int64_t c = 0; c < chunks; ++c) {
        for (int64_t i = 0; i < kTokenTile; ++i) {
          __m512i parts[kParts];
          split_chunk(x + (t + i) * x_stride + kChunkCols * c, parts);
          for (int p = 0; p < kParts; ++p) _mm512_store_si512(by_token[p][i], parts[p]);
        }
        for (int p = 0; p < kParts; ++p) {
          __m512 rows[kTileCols];
          transpose_16x16(reinterpret_cast<const float*>(by_token[p]), rows);
          for (int64_t q = 0; q < kPairRows; ++q)
            _mm512_store_ps(tile + c * chunk_bytes + p * kTileBytes + 64 * q, rows[q]);
        }
      }
    }
  }
  for (; t < end; ++t) one_token(t);
  // Columns no token's part takes multiply as zeros; whoever prepares the last token clears them.
  if (end != n) return;
  const int64_t last_tile = (n - 1) / kTokenTile, in_last = n - last_tile * kTokenTile;
  for (int64_t j = 0; j < layout.tiles * kTileCols; ++j) {
    if (j < kParts * layout.n && j % layout.n < in_last) continue;
    for (int64_t c = 0; c < chunks; ++c)
      _mm512_i32scatter_epi32(column_at(last_tile, j) + c * chunk_bytes, pair_rows, _mm512_setzero_si512(), 1);
  }
}

void amx_bf16_matmul(const WeightMatrix& w, int64_t r0, int64_t r1, const uint8_t* xp, int64_t /*xp_stride*/,
                     int64_t n, float* y, int64_t y_stride) {
  if (n > kTokenTile) return prefill(w, r0, r1, xp, n, y, y_stride);
  const PartLayout layout(n);
  const int64_t chunks = w.cols / kChunkCols;
  alignas(64) float sums[kMaxSegments][kParts][kInterleaveRows * kTileCols];
  int64_t configured = -1;
  for (int64_t row = r0; row < r1;) {
    Segment segments[kMaxSegments];
    int count = 0;
    for (; row < r1 && count < kMaxSegments; ++count) {
      const int64_t g = interleaved_group_rows(w, row), rows = std::min(r1, row - row % kInterleaveRows + g) - row;
      segments[count] = {row, rows, interleaved_vector(w, row, 0, 0), 64 * g};
      row += rows;
    }
    if (layout.tiles == 3) segments_pass<3>(segments, count, chunks, xp, sums, configured);
    else if (layout.tiles == 2) segments_pass<2>(segments, count, chunks, xp, sums, configured);
    else segments_pass<1>(segments, count, chunks, xp, sums, configured);
    for (int i = 0; i < count; ++i)
      store_results(sums[i], layout, segments[i].rows, segments[i].row, n, y, y_stride);
  }
  _tile_release();  // the next call configures its own; released tiles cost no context switch
}

}  // namespace tandem::cpu::detail

#pragma GCC diagnostic pop
#pragma GCC pop_options
