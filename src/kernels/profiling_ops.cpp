#include "kernels/profiling_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <tuple>

namespace tandem {

bool ProfilingOps::Key::operator<(const Key& o) const {
  return std::tie(phase, kind, a, b, c) < std::tie(o.phase, o.kind, o.a, o.b, o.c);
}

void ProfilingOps::set_phase(std::string_view phase) {
  if (phase.empty()) {
    phase_ = -1;
    return;
  }
  const auto it = std::find(phases_.begin(), phases_.end(), phase);
  phase_ = int(it - phases_.begin());
  if (it == phases_.end()) phases_.emplace_back(phase);
}

std::string ProfilingOps::describe(const Key& key) {
  switch (key.kind) {
    case Kind::Matmul: return fmt::format("matmul {}x{}", key.a, key.b);
    case Kind::Matmuls: return fmt::format("matmuls {}: {}x{}", key.c, key.a, key.b);
    case Kind::RmsNorm: return "rms_norm";
    case Kind::Rope: return "rope";
    case Kind::GeluGate: return "gelu_gate";
    case Kind::Add: return "add";
    case Kind::Scale: return "scale";
    case Kind::Softcap: return "softcap";
    case Kind::Embed: return "embed";
    case Kind::StoreKv: return "store_kv";
    case Kind::Attention: return key.a ? "attention sliding" : "attention full";
  }
  return "?";
}

std::vector<ProfilingOps::Entry> ProfilingOps::entries() const {
  std::vector<Entry> out;
  for (int p = 0; p < int(phases_.size()); ++p) {
    const size_t first = out.size();
    for (const auto& [key, stat] : stats_)
      if (key.phase == p) out.push_back({phases_[size_t(p)], describe(key), stat.calls, stat.seconds});
    std::stable_sort(out.begin() + long(first), out.end(),
                     [](const Entry& x, const Entry& y) { return x.seconds > y.seconds; });
  }
  return out;
}

void ProfilingOps::matmul(const WeightMatrix& w, const float* x, int64_t x_stride, int64_t n, float* y,
                          int64_t y_stride) {
  timed(Kind::Matmul, w.rows, w.cols, 1, [&] { inner_.matmul(w, x, x_stride, n, y, y_stride); });
}

void ProfilingOps::matmuls(std::span<const MatmulTarget> targets, const float* x, int64_t x_stride, int64_t n) {
  int64_t rows = 0, cols = 0;
  for (const MatmulTarget& t : targets) {
    rows += t.w->rows;
    cols = t.w->cols;
  }
  // A group of one (the LM head with its soft-cap) counts as a matmul.
  const Kind kind = targets.size() == 1 ? Kind::Matmul : Kind::Matmuls;
  timed(kind, rows, cols, int64_t(targets.size()), [&] { inner_.matmuls(targets, x, x_stride, n); });
}

void ProfilingOps::rms_norm(float* out, int64_t out_stride, const float* x, int64_t x_stride, int64_t n, int64_t dim,
                            const float* weight, float eps) {
  timed(Kind::RmsNorm, 0, 0, 0, [&] { inner_.rms_norm(out, out_stride, x, x_stride, n, dim, weight, eps); });
}

void ProfilingOps::rope(float* x, int64_t x_stride, int64_t n, int heads, int head_dim, const float* cos,
                        const float* sin) {
  timed(Kind::Rope, 0, 0, 0, [&] { inner_.rope(x, x_stride, n, heads, head_dim, cos, sin); });
}

void ProfilingOps::gelu_gate(float* gate, int64_t gate_stride, const float* up, int64_t up_stride, int64_t n,
                             int64_t width) {
  timed(Kind::GeluGate, 0, 0, 0, [&] { inner_.gelu_gate(gate, gate_stride, up, up_stride, n, width); });
}

void ProfilingOps::add(float* x, const float* y, int64_t count) {
  timed(Kind::Add, 0, 0, 0, [&] { inner_.add(x, y, count); });
}

void ProfilingOps::scale(float* x, int64_t count, float s) {
  timed(Kind::Scale, 0, 0, 0, [&] { inner_.scale(x, count, s); });
}

void ProfilingOps::softcap(float* x, int64_t count, float cap) {
  timed(Kind::Softcap, 0, 0, 0, [&] { inner_.softcap(x, count, cap); });
}

void ProfilingOps::embed(const WeightMatrix& table, const int32_t* ids, int64_t n, float scale, float* out,
                         int64_t out_stride) {
  timed(Kind::Embed, 0, 0, 0, [&] { inner_.embed(table, ids, n, scale, out, out_stride); });
}

void ProfilingOps::store_kv(const KvLayerView& kv, std::span<const KvSequence> sequences, const float* k,
                            int64_t k_stride, const float* v, int64_t v_stride) {
  timed(Kind::StoreKv, 0, 0, 0, [&] { inner_.store_kv(kv, sequences, k, k_stride, v, v_stride); });
}

void ProfilingOps::attention(const AttentionBatch& batch) {
  timed(Kind::Attention, batch.window > 0 ? 1 : 0, 0, 0, [&] { inner_.attention(batch); });
}

}  // namespace tandem
