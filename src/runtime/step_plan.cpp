#include "runtime/step_plan.h"

#include <cstring>

#include "core/error.h"

namespace tandem {

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, const std::vector<T>& items) {
  const uint64_t n = items.size();
  const size_t at = out.size();
  out.resize(at + sizeof n + n * sizeof(T));
  std::memcpy(out.data() + at, &n, sizeof n);
  if (n) std::memcpy(out.data() + at + sizeof n, items.data(), n * sizeof(T));
}

template <typename T>
void get(const uint8_t*& p, const uint8_t* end, std::vector<T>& items) {
  uint64_t n;
  if (size_t(end - p) < sizeof n) fail("step plan truncated");
  std::memcpy(&n, p, sizeof n);
  p += sizeof n;
  if (n > size_t(end - p) / sizeof(T)) fail("step plan truncated");
  items.resize(n);
  if (n) std::memcpy(items.data(), p, n * sizeof(T));
  p += n * sizeof(T);
}

}  // namespace

void StepPlan::clear() {
  command = Run;
  candidates = 0;
  need_log_normalizers = 0;
  kv_ops.clear();
  sequences.clear();
  tokens.clear();
}

std::vector<uint8_t> StepPlan::serialize() const {
  std::vector<uint8_t> out(3 * sizeof(int32_t));
  std::memcpy(out.data(), &command, sizeof(int32_t));
  std::memcpy(out.data() + sizeof(int32_t), &candidates, sizeof(int32_t));
  std::memcpy(out.data() + 2 * sizeof(int32_t), &need_log_normalizers, sizeof(int32_t));
  put(out, kv_ops);
  put(out, sequences);
  put(out, tokens);
  return out;
}

StepPlan StepPlan::deserialize(const uint8_t* data, size_t size) {
  StepPlan plan;
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  if (size < 3 * sizeof(int32_t)) fail("step plan truncated");
  std::memcpy(&plan.command, p, sizeof(int32_t));
  std::memcpy(&plan.candidates, p + sizeof(int32_t), sizeof(int32_t));
  std::memcpy(&plan.need_log_normalizers, p + 2 * sizeof(int32_t), sizeof(int32_t));
  p += 3 * sizeof(int32_t);
  get(p, end, plan.kv_ops);
  get(p, end, plan.sequences);
  get(p, end, plan.tokens);
  return plan;
}

}  // namespace tandem
