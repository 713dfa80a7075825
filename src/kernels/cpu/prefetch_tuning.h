#pragma once
// Where the CPU kernels' software prefetches go, by core (docs/kernels.md, "Prefetch on Zen 5").
// It also holds the one per-core choice of tile shape, wide_batch_tiles (session 44, below).
//
// Batched tiles prefetch the next row group, one line beside each load. A one-token tile of the row
// groups reads its group as one sequential stream. On Zen 4 the hardware prefetchers follow such a
// stream like a plain read, a software prefetch 4 KB ahead of it slowed it in a read test
// (docs/kernels.md, Row groups), and L1 prefetches a tile ahead cost the plain decode tiles up to
// half their speed: there batches prefetch into L2 and one-token tiles not at all. On Zen 5 the
// hardware prefetchers fall behind the one-token VNNI tile's arithmetic (0.6-0.7 of the probe),
// every line prefetched into L1 8 KB ahead brings it to 0.8-1.0 (E4B q4 decode 17 -> 24-25 tok/s),
// and the batches' prefetches into L1 instead of L2 made E4B batches of 8 faster (q8 13%, q4 9%,
// bf16 ~4%); bf16 batches gained another 3-4% from prefetching 8 KB ahead in their stream rather
// than the next group (20-80 KB ahead), where q8/q4 did not. One-token VNNI tiles on Zen 5 also
// read two row-group streams side by side, each 4 KB ahead (matmul_avx512_vnni_interleaved.cpp).
// On an Intel Xeon with AMX (session 41, a KVM guest of family 6) one-token VNNI decode without
// prefetches also read only ~0.7 of the probe, and the two prefetched streams took E4B decode to
// 0.80-0.87 (q4 9.0-9.4 -> 10.1-11.2 tok/s, q8 4.8 -> 5.7-6.0); 3 or 4 streams, 4 or 16 KB ahead,
// or prefetches into L2 measured the same. Its batches lost 10-15% with their prefetches in L1
// (E4B batches of 8: q8 30 -> 27, q4 46 -> 41, bf16 12.5 -> 11.3 tok/s) and bf16 batches gained
// nothing from prefetching in their stream, so Intel keeps those two Zen 4 choices. Every Intel CPU
// takes this tuning though only that one was measured; other CPUs keep the Zen 4 choices.
// Session 42, same Xeon: with the probe reading both plainly and with prefetches (it had read
// ~10% under what prefetched reads reach there), one-token Q8/Q4 decode read most with 4 streams
// taking one weight vector of each in turn, every line prefetched 2 KB ahead (8 KB in all): E4B q4
// roofline 0.80-0.82 (2 streams a chunk at a time, 4 KB ahead each) -> 0.85-0.88, q8 0.82-0.85 ->
// 0.86-0.88; 4 KB ahead each read 5% less, 1 KB and 3 KB about the same. Its one-token BF16
// streams, with no software prefetch until then, read 0.86-0.88 of that probe and 0.97-0.98 with
// every line prefetched into L1 2 KB ahead.
// Session 43, same Xeon: decode attention's key and value walks prefetched the next block (a pass
// later) into L2 and read 0.72-0.75 of the probe at 131072 keys; every line of each block's own
// stream prefetched into L1 512 elements ahead (f32 2 KB, bf16 1 KB) read 0.86-0.89 (f32 decode
// 26 -> 31 GB/s, bf16 27 -> 31, 8 sequences of 8192 keys f32 25 -> 30; E4B q4 decode at 8192
// tokens of context 9.04 -> 9.38 tok/s). 1 KB (f32) or 2 KB (bf16) ahead read a few percent less,
// 4 KB more so. Prefill items, whose query chunks reread each block from cache, keep the next
// block's prefetch. The AVX2 tables' one-token Q8/Q4 streams (three, a chunk of each in turn, left
// to the hardware prefetchers as on Zen 3) read 0.65-0.75 of the probe on this Xeon; each chunk's
// lines prefetched into L1 2 KB ahead as it starts took E4B decode on the AVX-VNNI table from
// 0.70-0.72 to 0.81-0.82 (q4, 9.0-9.3 -> 11.2 tok/s) and 0.75 -> 0.81 (q8), on the AVX2 table q4
// 0.65 -> 0.78; 1 KB ahead read about the same, 4 KB less. This reaches the Intel CPUs that run the
// AVX2 tables (client cores without AVX-512), whose own prefetchers were not measured.
// Session 50, same Xeon: those streams taken a vector of each in turn with every line prefetched 2
// KB ahead as it is loaded, the AVX-512 streams' walk, took E4B decode to 0.89-0.93 (AVX2 q8 0.75
// -> 0.90-0.91, q4 0.80 -> 0.89-0.91; AVX-VNNI q8 0.81-0.82 -> 0.91, q4 0.84-0.86 -> 0.91-0.93).
// The AVX2 one-token float row tiles (BF16 stays plain on AVX2) read 0.80-0.84 of the probe with
// the next tile warmed in L2 (`kernels_bench Matvec/bf16` under TANDEM_ISA=avx2, two threads);
// each row's line 4 KB ahead into L1, running on into the next tile's rows, 0.86-0.95 (2560 x 10240
// 1764-1854 -> 1514-1585 us, 10240 x 2560 1713-1820 -> 1598-1685; 1-2 KB ahead less, 6-8 KB none;
// both prefetches 0.79-0.87). E4B bf16 decode under TANDEM_ISA=avx2, runs alternated: roofline
// 0.796-0.815 -> 0.866-0.875 (2 KB ahead 0.855-0.865).
// Session 51, same Xeon: batches of 16 or more sequences went to the Q8/Q4 prefill panels, whose
// weight unpacking a few tokens do not repay: E4B batches of 16 ran slower in aggregate than
// batches of 8 (q4 44 against 55 tok/s, q8 27 against 36). The 2 x 8 tiles, each token tile of a
// pass over its row groups in turn (matmul_avx512_vnni_interleaved.cpp), took E4B batches (tiles
// against panels, alternated, tok/s) q4 16: 57 / 44, 24: 64 / 52, 32: 61 / 57, 40: 64 / 62, 48:
// 62 / 68; q8 16: 46 / 27, 32: 56 / 43, 48: 57 / 50. Other CPUs keep the panels from 16 tokens,
// where the crossover was not measured again, except Zen 5 (session 52 below).
// Session 52, a Zen 5 VM again: batches of 2-8 tokens over BF16/F16 row groups had gone through the
// batch tiles, one or two adjacent groups at a time, and read 25-33 GB/s from DRAM on two cores
// where one token's four streams read ~60 (E4B bf16 batches of 2 ran 1.2-1.8x a single decode).
// They now take the one-token walk over four streams, each line prefetched into L1 2 KB ahead:
// `kernels_bench` 2 tokens (10240 x 2560 / 2560 x 10240, medians, ms) 1.06 / 1.15 -> 0.94 / 1.00
// with 1 KB, 1.21 / 1.18 -> 1.04 / 1.03 with 4 KB, and 2 KB against 1 KB side by side 0.99 / 1.03
// against 1.11 / 1.14; without prefetches the streams alone took 2 tokens from the tiles' 1.65 /
// 1.37 to 1.25 / 1.07. Intel
// reads its BF16 batches with AMX, so this reaches only its F16 batches there, unmeasured; it
// takes its one-token streams' 2 KB. Other CPUs keep the streams without prefetches.
// On the same Zen 5 VM the Q8/Q4 batch tiles beat the prefill panels up to 48 tokens (Q4 too,
// where Intel's panels won from 41): `kernels_bench` Batch16 q8i 3.5-4.8 -> 1.4-2.1 ms, q4i 2.3-2.8
// -> 1.1-1.2; Batch48 q4i 4.2-5.4 -> 3.0; E4B batches of 16 (tok/s) q8 29 -> 46, q4 38 -> 68.
// Session 53, a Zen 4 VM (family 25 model 17): its 256-bit units run each 512-bit FMA and store in
// two halves, and the streams' sums in L1 (a load and a store per row and token) made those batches
// store-bound: `kernels_bench` 10240 x 2560 and 2560 x 10240, two threads from DRAM (ms, streams
// against tiles) 2 tokens 1.70 / 1.65 against 2.25 / 1.85, 3 tokens 1.8-2.1 either way, 4 tokens
// 2.51 / 2.52 against 1.84 / 1.89, 8 tokens 4.84 / 4.97 against 2.07 / 2.22; E4B bf16 batches of
// 8 8.7 -> 18.8 tok/s with the tiles. So CPUs other than Zen 5 and Intel take streams for 2 tokens
// only (float_stream_tokens); Zen 5 had measured 8 the same either way and keeps them.
// Session 54, the Zen 5 VM: Q8/Q4 batches of 2 in the one-token streams (quant_stream_tokens)
// against the batch tiles, E4B q8 batches of 2 19.6-19.8 -> 25.3-26.4 tok/s, q4 about even to 3%
// faster; 3 and 4 tokens in the streams were slower end to end (q4 batches of 4 60 -> 41 tok/s).
// Intel (4 streams) and Zen 4 (no streams) were not measured with two tokens and keep the tiles.
#include <cstdint>

#include "core/cpu_features.h"

namespace tandem::cpu::detail {

struct PrefetchTuning {
  int64_t decode_ahead = 0;    // bytes ahead of a one-token VNNI tile's loads, into L1; 0: none
  bool batch_into_l1 = false;  // batched tiles' next-group lines into L1 (else L2)
  // Bytes ahead of a batched BF16/F16 row-group tile's loads; 0: the next group at the same columns.
  int64_t float_batch_ahead = 0;
  // A thread's VNNI decode of one token (or of up to quant_stream_tokens) reads its rows as this
  // many row-group streams side by side, each prefetched decode_ahead / decode_streams bytes ahead;
  // 0: its rows in order.
  int decode_streams = 0;
  // Bytes ahead of the one-token BF16/F16 streams' loads, into L1; 0: none.
  int64_t float_decode_ahead = 0;
  // AVX-512 attention: elements ahead of the loads in each KV block's keys and values (running on
  // into the next block a pass later), into L1; 0: that next block's lines at the same place, into L2.
  int64_t attention_ahead_elements = 0;
  // Bytes ahead in its stream of each line the AVX2/AVX-VNNI one-token Q8/Q4 streams load, prefetched
  // into L1 as it is loaded, the streams then taken a vector of each at a time; 0: no prefetches,
  // a chunk of each stream at a time.
  int64_t avx2_decode_ahead = 0;
  // AVX-512 Q8/Q4 batches of 5 tokens or more in tiles of 2 rows x up to 8 tokens, each weight line read
  // once for 8 tokens (else 4 x 4; matmul_avx512_vnni_interleaved.cpp).
  bool wide_batch_tiles = false;
  // Bytes ahead of the AVX2 one-token float row tiles' loads (plain F32/F16/BF16 rows, four at a
  // time; matmul_avx2.cpp), into L1; 0: the next row tile's lines at the same columns, into L2.
  int64_t avx2_float_decode_ahead = 0;
  // Most tokens the AVX-512 Q8/Q4 batch tiles take over interleaved weights, reading each weight
  // line once from memory for all of them; more go to the prefill panels, which first unpack the
  // weights into L2 (matmul_avx512_vnni.cpp).
  int q8_batch_tile_tokens = 15;
  int q4_batch_tile_tokens = 15;
  // Bytes ahead of the BF16/F16 streams' loads for 2-8 tokens (stream_groups_tokens in
  // matmul_avx512.cpp), into L1; 0: none.
  int64_t float_stream_tokens_ahead = 0;
  // Most tokens (1 to kMatvecStreamTokens) the AVX-512 BF16/F16 streams take; more go to the batch
  // tiles, whose sums stay in registers.
  int float_stream_tokens = 2;
  // Most tokens (1 or 2) the AVX-512 Q8/Q4 streams take (with decode_streams > 0); more go to the
  // batch tiles.
  int quant_stream_tokens = 1;
};

// This CPU's choices; tests swap in another core's through ScopedPrefetchTuning.
inline PrefetchTuning& tuning_for_this_cpu() {
  static PrefetchTuning tuning = [] {
    const CpuFeatures& f = cpu_features();
    const bool zen5_or_later = f.amd && f.family >= 0x1a;
    if (zen5_or_later) {
      PrefetchTuning zen5{8192, true, 8192, 2, 0};
      zen5.q8_batch_tile_tokens = zen5.q4_batch_tile_tokens = 48;
      zen5.float_stream_tokens_ahead = 2048;
      zen5.float_stream_tokens = 8;
      zen5.quant_stream_tokens = 2;
      return zen5;
    }
    if (f.intel) {
      PrefetchTuning intel{8192, false, 0, 4, 2048, 512, 2048, true, 4096, 48, 40};
      intel.float_stream_tokens_ahead = 2048;
      intel.float_stream_tokens = 8;
      return intel;
    }
    return PrefetchTuning{};
  }();
  return tuning;
}

inline const PrefetchTuning& prefetch_tuning() { return tuning_for_this_cpu(); }

// Tests: the kernels run with another core's choices while this lives, so that every path is
// checked on whichever CPU runs them. Set it while no kernel runs.
class ScopedPrefetchTuning {
 public:
  explicit ScopedPrefetchTuning(const PrefetchTuning& tuning) : saved_(tuning_for_this_cpu()) {
    tuning_for_this_cpu() = tuning;
  }
  ~ScopedPrefetchTuning() { tuning_for_this_cpu() = saved_; }
  ScopedPrefetchTuning(const ScopedPrefetchTuning&) = delete;
  ScopedPrefetchTuning& operator=(const ScopedPrefetchTuning&) = delete;

 private:
  PrefetchTuning saved_;
};

}  // namespace tandem::cpu::detail
