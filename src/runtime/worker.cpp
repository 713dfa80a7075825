#include "runtime/worker.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

Worker::Worker(const Gemma4Checkpoint& ckpt, Ops& ops, Communicator& comm, const WorkerOptions& options)
    : options_(options), slots_(size_t(options.max_slots)), comm_(comm) {
  const KvCacheOptions kv = KvCache::plan(ckpt.config, ckpt.weights, options.kv_memory_bytes, options.max_slots,
                                          options.max_step_tokens, options.kv_block_size, options.kv_dtype);
  cache_ = std::make_unique<KvCache>(ckpt.config, ckpt.weights, kv);
  // Every running sequence may want one logit row per step.
  model_ = std::make_unique<Gemma4Model>(ckpt.config, ckpt.weights, ops, comm, *cache_, options.max_step_tokens,
                                         options.max_slots);
  batch_.reserve(size_t(options.max_slots));
}

void Worker::execute(const StepPlan& plan) {
  for (const KvOp& op : plan.kv_ops) {
    KvSequenceBlocks& blocks = slots_[size_t(op.slot)];
    if (op.kind == KvOp::Release) {
      cache_->release(blocks);
    } else if (!cache_->reserve(blocks, op.end)) {
      fail("KV reservation of slot {} to {} positions failed while replaying a step", op.slot, op.end);
    }
  }
  batch_.clear();
  for (const PlannedSequence& s : plan.sequences) {
    StepSequence step;
    step.kv = &slots_[size_t(s.slot)];
    step.tokens = std::span<const int32_t>(plan.tokens).subspan(size_t(s.first_token), size_t(s.token_count));
    step.logit_rows = s.logit_rows;
    batch_.push_back(step);
  }
  if (!batch_.empty()) model_->forward(batch_);
}

}  // namespace tandem

namespace tandem {

std::span<const float> Worker::full_logits() {
  const int rows = model_->logit_rows();
  const int64_t local = model_->vocab_local();
  if (comm_.size() == 1) return {model_->logits(0), size_t(rows) * size_t(local)};
  // Every rank holds an equal slice of the vocabulary (ShardPlan checks it divides evenly).
  const int ranks = comm_.size();
  gathered_.resize(size_t(rows) * size_t(local) * size_t(ranks));
  full_.resize(size_t(rows) * size_t(local) * size_t(ranks));
  if (rows == 0) return {};
  comm_.all_gather(model_->logits(0), gathered_.data(), size_t(rows) * size_t(local) * sizeof(float));
  for (int k = 0; k < ranks; ++k)
    for (int r = 0; r < rows; ++r)
      std::copy_n(gathered_.data() + (size_t(k) * rows + size_t(r)) * size_t(local), local,
                  full_.data() + size_t(r) * size_t(local) * ranks + size_t(k) * size_t(local));
  return full_;
}

}  // namespace tandem
