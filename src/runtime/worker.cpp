#include "runtime/worker.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "runtime/sampler.h"

namespace tandem {

Worker::Worker(const Gemma4Checkpoint& ckpt, Ops& ops, Communicator& comm, const WorkerOptions& options)
    : options_(options), slots_(size_t(options.max_slots)), comm_(comm) {
  KvCacheOptions kv = KvCache::plan(ckpt.config, ckpt.weights, options.kv_memory_bytes, options.max_slots,
                                    options.max_step_tokens, options.kv_block_size, options.kv_dtype, options.prefix_reuse);
  kv.prefault = options.kv_prefault;
  cache_ = std::make_unique<KvCache>(ckpt.config, ckpt.weights, kv);
  // Every running sequence may want one logit row per step, a scored prompt one per token.
  model_ = std::make_unique<Gemma4Model>(ckpt.config, ckpt.weights, ops, comm, *cache_, options.max_step_tokens,
                                         max_logit_rows());
  batch_.reserve(size_t(options.max_slots));
}

void Worker::execute(const StepPlan& plan) {
  for (const KvOp& op : plan.kv_ops) {
    KvSequenceBlocks& blocks = slots_[size_t(op.slot)];
    if (op.kind == KvOp::Release) {
      cache_->release(blocks);
    } else if (op.kind == KvOp::Truncate) {
      if (!cache_->truncate(blocks, op.end))
        fail("KV cut of slot {} to {} positions failed while replaying a step", op.slot, op.end);
    } else if (op.kind == KvOp::Pin) {
      cache_->pin(blocks, op.end);
    } else if (op.kind == KvOp::Copy) {
      if (!cache_->copy_prefix(slots_[size_t(op.source)], blocks, op.end))
        fail("KV copy of {} positions from slot {} to slot {} failed while replaying a step", op.end, op.source, op.slot);
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

namespace {

struct Candidate {
  int32_t id;
  float logit;
};

}  // namespace

std::span<const float> Worker::full_logits(int candidates, bool with_normalizers) {
  const int rows = model_->logit_rows();
  const int64_t local = model_->vocab_local();
  const int ranks = comm_.size();
  normalizers_.assign(size_t(rows), 0.0);
  if (ranks == 1) {
    for (int r = 0; r < rows && with_normalizers; ++r)
      normalizers_[size_t(r)] = log_normalizer(std::span(model_->logits(r), size_t(local)));
    return {model_->logits(0), size_t(rows) * size_t(local)};
  }
  // Per row and rank: [max, sum of exp(logit - max)] as two doubles (-inf and 0 where no request
  // of the step wants log-probabilities), then `c` candidates.
  const int c = int(std::clamp<int64_t>(candidates, 1, local));
  const size_t row_bytes = 2 * sizeof(double) + size_t(c) * sizeof(Candidate);
  packed_.resize(size_t(rows) * row_bytes);
  for (int r = 0; r < rows; ++r) {
    const float* logits = model_->logits(r);
    const RowExpSums e = with_normalizers ? row_exp_sums(std::span(logits, size_t(local))) : RowExpSums{};
    const double stats[2] = {e.max, e.sum};
    uint8_t* out = packed_.data() + size_t(r) * row_bytes;
    std::memcpy(out, stats, sizeof stats);
    if (c < local) {
      top_k_order(std::span(logits, size_t(local)), size_t(c), maxima_, order_);
    } else {  // the whole slice (a request with biases or penalties): the merge needs no order
      order_.resize(size_t(local));
      std::iota(order_.begin(), order_.end(), 0);
    }
    for (int i = 0; i < c; ++i) {
      const int32_t id = order_[size_t(std::min(i, int(order_.size()) - 1))];  // c <= local: there are c
      const Candidate cand{int32_t(model_->vocab_first() + id), logits[id]};
      std::memcpy(out + 2 * sizeof(double) + size_t(i) * sizeof(Candidate), &cand, sizeof cand);
    }
  }
  gathered_.resize(packed_.size() * size_t(ranks));
  if (rows > 0) comm_.all_gather(packed_.data(), gathered_.data(), packed_.size());
  const int64_t vocab = local * ranks;
  full_.assign(size_t(rows) * size_t(vocab), -INFINITY);
  for (int r = 0; r < rows; ++r) {
    double global_max = -INFINITY;
    for (int k = 0; k < ranks; ++k) {
      double m;
      std::memcpy(&m, gathered_.data() + size_t(k) * packed_.size() + size_t(r) * row_bytes, sizeof m);
      global_max = std::max(global_max, m);
    }
    double sum = 0.0;
    for (int k = 0; k < ranks; ++k) {
      const uint8_t* in = gathered_.data() + size_t(k) * packed_.size() + size_t(r) * row_bytes;
      double stats[2];
      std::memcpy(stats, in, sizeof stats);
      if (stats[0] > -INFINITY) sum += stats[1] * std::exp(stats[0] - global_max);  // a rank with no finite logit adds 0
      for (int i = 0; i < c; ++i) {
        Candidate cand;
        std::memcpy(&cand, in + 2 * sizeof(double) + size_t(i) * sizeof(Candidate), sizeof cand);
        full_[size_t(r) * size_t(vocab) + size_t(cand.id)] = cand.logit;
      }
    }
    normalizers_[size_t(r)] = sum > 0.0 ? global_max + std::log(sum) : -INFINITY;
  }
  return full_;
}

}  // namespace tandem
