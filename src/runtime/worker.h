#pragma once
// Executes step plans on one rank: owns the KV cache and the model forward for that rank, and the
// block tables of every sequence slot. The same code runs on every tensor-parallel rank.
#include <algorithm>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "model/checkpoint.h"
#include "model/gemma4.h"
#include "model/kv_cache.h"
#include "parallel/communicator.h"
#include "runtime/step_plan.h"

namespace tandem {

struct WorkerOptions {
  int max_slots = 16;         // sequences that can be running at once
  int max_step_tokens = 256;  // tokens per step (prefill chunks plus decodes)
  // Logit rows per step: one per running sequence, and up to this many for prompts whose every
  // token is scored (prompt logprobs); each row is a vocabulary of floats (1 MB for Gemma's).
  int max_logit_rows = 32;
  size_t kv_memory_bytes = size_t(1) << 30;
  int kv_block_size = 16;
  KvDType kv_dtype = KvDType::F32;
  bool kv_prefault = false;  // KvCacheOptions::prefault
  // Ended sequences keep their KV blocks for prompts that start the same (Scheduler), and each
  // sequence pins its prompt's sliding window (KvCache::pin) so that it can be cut back there.
  bool prefix_reuse = true;
};

class Worker {
 public:
  Worker(const Gemma4Checkpoint& checkpoint, Ops& ops, Communicator& comm, const WorkerOptions& options);

  // Applies the plan's KV operations in order, then runs its sequences. The planner checked the
  // reservations against the free blocks, so a failure here is a bug, reported as an Error.
  void execute(const StepPlan& plan);

  // The logits of the last step as full vocabulary rows, in plan order, and each row's log
  // normalizer (log-sum-exp over the whole vocabulary). With tensor parallelism this is a
  // collective that every rank calls after execute(): each rank contributes only its `candidates`
  // largest logits per row and its partial normalizer, and the other entries of the rows are
  // -inf (see docs/parallel.md for what that means for sampling).
  // Normalizers are computed only when `with_normalizers` is set (they cost a pass over the row).
  std::span<const float> full_logits(int candidates, bool with_normalizers);
  std::span<const double> log_normalizers() const { return normalizers_; }
  std::span<const uint8_t> non_finite_rows() const { return model_->non_finite_rows(); }  // Gemma4Model's

  const Gemma4Model& model() const { return *model_; }
  const KvCache& cache() const { return *cache_; }
  const KvSequenceBlocks& slot(int s) const { return slots_[size_t(s)]; }
  const WorkerOptions& options() const { return options_; }
  int max_logit_rows() const { return std::max(options_.max_slots, options_.max_logit_rows); }

 private:
  WorkerOptions options_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Gemma4Model> model_;
  std::vector<KvSequenceBlocks> slots_;
  std::vector<StepSequence> batch_;
  Communicator& comm_;
  std::vector<float> full_;
  std::vector<double> normalizers_;
  std::vector<uint8_t> packed_, gathered_;
  std::vector<int32_t> order_;
  std::vector<float> maxima_;  // scratch of top_k_order
};

}  // namespace tandem
