#include "kernels/cpu/cpu_ops.h"

#include <cstring>

#include "core/dtype.h"
#include "kernels/cpu/attention.h"

namespace tandem::cpu {

namespace {

// Norms and gates of fewer values than this run on the calling thread. Their input was just
// written by the threads of a matmul and their output is read by the next one, so a thread
// hand-off adds the pool's wake-up and moves every line between the cores. Zen 5 VM, two threads,
// input written by the caller (a test program; serial against pooled, us): rms_norm of 2560
// values x 8 rows 3.9 against 5.5, x 32 rows 15.7 against 18.3; gelu_gate of 10240 values 2.8
// against 7.8. In E4B, batches of 8 (steps alternated A-B-B-A in one process) ran 1.03-1.04x with
// their hidden-state norms (20480 values) and PLE gates (2048) serial, until then pooled from
// 16384 and 2048 values on, and the same with their MLP gates (81920) serial too, so the line
// sits below those; one token's decode, with its 10240-value MLP gate serial, within the noise
// (0.98-1.04).
constexpr int64_t kSerialBelow = 1 << 16;

}  // namespace

CpuOps::CpuOps(ThreadPool& pool, const KernelTable& kernels) : pool_(pool), k_(kernels) {}

void CpuOps::matmul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n, float* y, int64_t y_stride) {
  cpu::matmul(pool_, k_, w, x, x_stride, n, y, y_stride);
}

void CpuOps::matmuls(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride, int64_t n) {
  cpu::matmul_group(pool_, k_, targets, x, x_stride, n);
}

void CpuOps::rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t n, int64_t dim,
                      const float* weight, float eps) {
  auto rows = [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) k_.rms_norm(out + i * out_stride, x + i * x_stride, weight, dim, eps);
  };
  if (n * dim < kSerialBelow) rows(0, n);
  else pool_.parallel_for(n, rows);
}

void CpuOps::rope(float* x, int64_t x_stride, int64_t n, int heads, int head_dim, const float* cos,
                  const float* sin) {
  const int half = head_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float* c = cos + i * half;
    const float* s = sin + i * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x + i * x_stride + int64_t(h) * head_dim;
      for (int d = 0; d < half; ++d) {
        const float a = v[d], b = v[d + half];
        v[d] = a * c[d] - b * s[d];
        v[d + half] = b * c[d] + a * s[d];
      }
    }
  }
}

void CpuOps::gelu_gate(float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n,
                       int64_t width) {
  auto range = [&](int64_t b, int64_t e) {
    // Walk the flattened range row by row so each kernel call stays within one row.
    while (b < e) {
      const int64_t row = b / width, col = b % width;
      const int64_t len = std::min(e - b, width - col);
      k_.gelu_gate(gate + row * gate_stride + col, up + row * up_stride + col, len);
      b += len;
    }
  };
  if (n * width < kSerialBelow) range(0, n * width);
  else pool_.parallel_for(n * width, range, 256);
}

void CpuOps::add(float* x, const float* y, int64_t count) { k_.add(x, y, count); }
void CpuOps::scale(float* x, int64_t count, float s) { k_.scale(x, count, s); }
void CpuOps::softcap(float* x, int64_t count, float cap) {
  pool_.parallel_for(count, [&](int64_t b, int64_t e) { k_.softcap(x + b, e - b, cap); }, 1024);
}

void CpuOps::embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float scale, float* out,
                   int64_t out_stride) {
  for (int64_t i = 0; i < n; ++i) {
    table.row_to_float(ids[i], out + i * out_stride);
    if (scale != 1.0f) k_.scale(out + i * out_stride, table.cols, scale);
  }
}

namespace {

// One row's K and V of one KV head into its slot of the paged cache.
void store_kv_head(const KvLayerView& kv, const KvSequence& seq, int r, int g, const float* k, int64_t k_stride,
                   const float* v, int64_t v_stride) {
  const int D = kv.head_dim;
  const int32_t p = seq.positions[r];
  const int64_t block = seq.blocks[p / kv.block_size - seq.first_logical_block];
  const int slot = p % kv.block_size;
  const float* ks = k + int64_t(seq.first_row + r) * k_stride + int64_t(g) * D;
  const float* vs = v + int64_t(seq.first_row + r) * v_stride + int64_t(g) * D;
  const int64_t key0 = kv.key_offset(block, g, slot, 0);
  if (kv.dtype == KvDType::F32) {
    float* kd = static_cast<float*>(kv.keys);
    for (int d = 0; d < D; ++d) kd[key0 + int64_t(d) * kv.block_size] = ks[d];  // transposed
    for (int d = 0; d < D; d += kv.value_run())  // the slot's part of each run
      std::memcpy(static_cast<float*>(kv.values) + kv.value_offset(block, g, slot, d), vs + d,
                  size_t(kv.value_run_width(d)) * 4);
  } else {
    uint16_t* kd = static_cast<uint16_t*>(kv.keys);
    for (int d = 0; d < D; ++d) kd[key0 + int64_t(d) * kv.block_size] = f32_to_bf16(ks[d]);
    for (int d = 0; d < D; d += kv.value_run()) {
      uint16_t* vd = static_cast<uint16_t*>(kv.values) + kv.value_offset(block, g, slot, d);
      for (int i = 0; i < kv.value_run_width(d); ++i) vd[i] = f32_to_bf16(vs[d + i]);
    }
  }
}

}  // namespace

// Each (row, KV head) writes head_dim keys a block_size-element stride apart (64 bytes for f32 keys
// in blocks of 16, 32 for bf16), on lines usually evicted since the last step: the stores wait on
// those lines.
// Spread over the pool, each thread waits on its own share. E4B q4 on two threads (Intel Xeon,
// per-call timers in `tandem bench`): a call for a batch of 8 decodes 67 -> 43 us, for one token
// 10 -> 8 us; the bench's prompts (one of 512 tokens, nine of 16) 20 -> 9 ms in all. Prefetching the
// key lines for writing first gained nothing more.
void CpuOps::store_kv(const KvLayerView& kv, std::span<const KvSequence> sequences, const float* k,
                      int64_t k_stride, const float* v, int64_t v_stride) {
  int64_t rows = 0;
  for (const KvSequence& seq : sequences) rows += seq.rows;
  const int heads = kv.kv_heads;
  // Items are (row, head) in sequence order; a range walks its sequences from the one it starts in.
  auto store = [&](int64_t i0, int64_t i1) {
    size_t s = 0;
    int64_t first = 0;  // the first item of sequences[s]
    for (int64_t i = i0; i < i1; ++i) {
      while (i >= first + int64_t(sequences[s].rows) * heads) first += int64_t(sequences[s++].rows) * heads;
      const int64_t within = i - first;
      store_kv_head(kv, sequences[s], int(within / heads), int(within % heads), k, k_stride, v, v_stride);
    }
  };
  pool_.parallel_for(rows * heads, store);
}

void CpuOps::attention(const AttentionBatch& batch) { paged_attention(pool_, k_, batch, attention_scratch_); }

}  // namespace tandem::cpu
