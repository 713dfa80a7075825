#pragma once
// The ops interface: everything the fast model forward needs from a backend, at the granularity
// of whole batches. The CPU backend implements it over SIMD kernels and a thread pool; a GPU
// backend would implement the same calls over device memory. Buffers are row-major float32 with
// explicit row strides (in elements).
#include <cstdint>
#include <span>
#include <string_view>

#include "kernels/weight.h"

namespace tandem {

enum class KvDType : uint8_t { F32, BF16 };
size_t kv_dtype_size(KvDType dtype);
std::string_view kv_dtype_name(KvDType dtype);

// One layer's paged K/V storage; a block's elements of one KV head are block_size * head_dim
// consecutive elements at b * block_stride + g * head_stride. Keys are stored transposed there,
// dimension d of slot s at d * block_size + s: one dimension of a block's keys is one contiguous
// vector (16 keys = one AVX-512 register), which is what the attention kernels multiply the
// queries against. Values come in runs of 64 bytes of dimensions (value_run(): 16 f32 or 32
// bf16; the last run narrower where head_dim is not a multiple), each run holding every slot's
// dimensions side by side: [run][slot][dimension within the run]. The kernels add a run of
// dimensions over a block's slots at a time, so they read a block's values in address order; with
// slot-major rows those reads were block_size lines head_dim elements apart (docs/kernels.md).
struct KvLayerView {
  int64_t key_offset(int64_t block, int kv_head, int slot, int dim) const {
    return block * block_stride + kv_head * head_stride + int64_t(dim) * block_size + slot;
  }
  static constexpr int value_run_of(KvDType t) { return t == KvDType::F32 ? 16 : 32; }
  int value_run() const { return value_run_of(dtype); }
  // Where value (block, kv_head, slot, dim) sits; the run of dim holds value_run_width(dim)
  // consecutive dimensions of each slot.
  int64_t value_offset(int64_t block, int kv_head, int slot, int dim) const {
    const int run_start = dim / value_run() * value_run();
    return block * block_stride + kv_head * head_stride + int64_t(run_start) * block_size +
           int64_t(slot) * value_run_width(dim) + (dim - run_start);
  }
  int value_run_width(int dim) const {
    const int run_start = dim / value_run() * value_run();
    return head_dim - run_start < value_run() ? head_dim - run_start : value_run();
  }

  void* keys = nullptr;
  void* values = nullptr;
  KvDType dtype = KvDType::F32;
  int64_t block_stride = 0;
  int64_t head_stride = 0;
  int block_size = 0;
  int head_dim = 0;
  int kv_heads = 0;
};

// The rows of one sequence in a batch. Position p lives in block blocks[p / block_size -
// first_logical_block] (sliding layers drop blocks that left the window), slot p % block_size.
struct KvSequence {
  int first_row = 0;
  int rows = 0;
  const int32_t* positions = nullptr;  // one per row, increasing
  const int32_t* blocks = nullptr;
  int64_t first_logical_block = 0;
};

struct AttentionBatch {
  const float* q = nullptr;  // row r, local head h at q + r * q_stride + h * head_dim
  int64_t q_stride = 0;
  float* out = nullptr;      // same layout as q
  int64_t out_stride = 0;
  int q_heads = 0;           // local query heads
  int q_first = 0;           // global index of local head 0
  int kv_first = 0;          // global index of local KV head 0
  int group = 1;             // query heads per KV head in the model
  int window = 0;            // 0: causal over all keys; else keys in (p - window, p]
  KvLayerView kv;
  std::span<const KvSequence> sequences;
};

// One product of a grouped matmul: y[i * y_stride + r] = W(r, :) . x_i, then, where softcap > 0,
// softcap * tanh(y / softcap) as Ops::softcap gives it (the LM head's final logit soft-cap).
struct MatmulTarget {
  const WeightMatrix* w = nullptr;
  float* y = nullptr;
  int64_t y_stride = 0;
  float softcap = 0.0f;
};

class Ops {
 public:
  virtual ~Ops() = default;
  virtual std::string_view name() const = 0;

  // y[i, r] = sum_c W[r, c] * x[i, c] for i < n
  virtual void matmul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n, float* y,
                      int64_t y_stride) = 0;
  // Several matrices over the same activations (q/k/v, gate/up). A backend may run them as one
  // pass (one hand-off to its threads, one quantization of x), and soft-cap each piece of a
  // target's rows as it is written; the results are those of matmul() and softcap().
  virtual void matmuls(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride, int64_t n) {
    for (const MatmulTarget& t : targets) {
      matmul(*t.w, x, x_stride, n, t.y, t.y_stride);
      if (t.softcap > 0)
        for (int64_t i = 0; i < n; ++i) softcap(t.y + i * t.y_stride, t.w->rows, t.softcap);
    }
  }
  // n rows of dim values: out = x * (mean(x^2) + eps)^-0.5 * weight (weight may be null)
  virtual void rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t n, int64_t dim,
                        const float* weight, float eps) = 0;
  // Rotate-half RoPE on n rows of `heads` heads of head_dim; cos/sin hold head_dim/2 values per row.
  virtual void rope(float* x, int64_t x_stride, int64_t n, int heads, int head_dim, const float* cos,
                    const float* sin) = 0;
  virtual void gelu_gate(float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n,
                         int64_t width) = 0;
  virtual void add(float* x, const float* y, int64_t count) = 0;
  virtual void scale(float* x, int64_t count, float s) = 0;
  virtual void softcap(float* x, int64_t count, float cap) = 0;
  // out[i] = table row ids[i] widened to float, times scale
  virtual void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float scale, float* out,
                     int64_t out_stride) = 0;
  // Writes the K and V rows (kv_heads * head_dim each) of every sequence's rows into the paged cache.
  virtual void store_kv(const KvLayerView& kv, std::span<const KvSequence> sequences, const float* k,
                        int64_t k_stride, const float* v, int64_t v_stride) = 0;
  virtual void attention(const AttentionBatch& batch) = 0;
};

}  // namespace tandem
