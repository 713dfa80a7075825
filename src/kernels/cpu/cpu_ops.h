#pragma once
// The CPU backend of the ops interface: SIMD kernels (chosen at run time) over a persistent
// thread pool. Scratch buffers grow to the largest batch seen and are then reused, so steady-state
// steps allocate nothing.
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"

namespace tandem::cpu {

class CpuOps final : public Ops {
 public:
  explicit CpuOps(ThreadPool& pool, const KernelTable& kernels = active_kernels());
  std::string_view name() const override { return "cpu"; }
  ThreadPool& pool() { return pool_; }
  const KernelTable& kernels() const { return k_; }

  void matmul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n, float* y,
              int64_t y_stride) override;
  void matmuls(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride, int64_t n) override;
  void rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t n, int64_t dim,
                const float* weight, float eps) override;
  void rope(float* x, int64_t x_stride, int64_t n, int heads, int head_dim, const float* cos,
            const float* sin) override;
  void gelu_gate(float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n,
                 int64_t width) override;
  void add(float* x, const float* y, int64_t count) override;
  void scale(float* x, int64_t count, float s) override;
  void softcap(float* x, int64_t count, float cap) override;
  void embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float scale, float* out,
             int64_t out_stride) override;
  void store_kv(const KvLayerView& kv, std::span<const KvSequence> sequences, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride) override;
  void attention(const AttentionBatch& batch) override;

 private:
  ThreadPool& pool_;
  const KernelTable& k_;
  std::vector<float> attention_scratch_;
};

}  // namespace tandem::cpu
