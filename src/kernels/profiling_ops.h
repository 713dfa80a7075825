#pragma once
// An Ops that forwards every call to another and adds up its wall time, per phase and per kind of
// call: a matmul by its matrix's shape, a group by its matrices' shapes, attention as sliding or
// full. `tandem bench --profile` prints where a decode step's time goes with it. The CPU backend's
// calls return when their work is done, so each call's time is its own; a backend that queued work
// asynchronously would need a synchronizing inner Ops for the split to mean anything.
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/ops.h"

namespace tandem {

class ProfilingOps : public Ops {
 public:
  struct Entry {
    std::string phase;
    std::string what;  // e.g. "matmul 2560x10240", "matmuls 2: 20480x2560" (rows in all), "attention full"
    int64_t calls = 0;
    double seconds = 0;
  };

  explicit ProfilingOps(Ops& inner) : inner_(inner) {}

  // Calls from now on count toward `phase`; an empty name counts them nowhere.
  void set_phase(std::string_view phase);
  // Per phase (in the order they were first set), the kinds of call by time spent, most first.
  std::vector<Entry> entries() const;

  std::string_view name() const override { return inner_.name(); }
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
  enum class Kind { Matmul, Matmuls, RmsNorm, Rope, GeluGate, Add, Scale, Softcap, Embed, StoreKv, Attention };
  // What a call is counted as: its kind, and for matmuls rows, columns and matrices (a group's
  // rows summed: they share their columns), for attention whether it is sliding (a = 1).
  struct Key {
    int phase;
    Kind kind;
    int64_t a = 0, b = 0, c = 0;
    bool operator<(const Key& o) const;
  };
  struct Stat {
    int64_t calls = 0;
    double seconds = 0;
  };
  using Clock = std::chrono::steady_clock;
  template <typename F>
  void timed(Kind kind, int64_t a, int64_t b, int64_t c, F&& call) {  // a, b, c: see Key
    if (phase_ < 0) return call();
    const Clock::time_point start = Clock::now();
    call();
    Stat& s = stats_[Key{phase_, kind, a, b, c}];
    s.calls += 1;
    s.seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  static std::string describe(const Key& key);

  Ops& inner_;
  std::vector<std::string> phases_;
  int phase_ = -1;
  std::map<Key, Stat> stats_;
};

}  // namespace tandem
