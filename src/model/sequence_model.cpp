#include "model/sequence_model.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

namespace {
constexpr int kMaxLogitRows = 16;
}  // namespace

FastSequenceModel::FastSequenceModel(const Gemma4Checkpoint& ckpt, Ops& ops, Communicator& comm, int max_context,
                                     int chunk_tokens, KvDType kv_dtype)
    : chunk_tokens_(chunk_tokens), max_context_(max_context), comm_(comm) {
  const Gemma4Config& c = ckpt.config;
  if (max_context < 1) fail("the context must hold at least one token");
  KvCacheOptions o;
  o.block_size = 16;
  o.dtype = kv_dtype;
  o.full_blocks = (int64_t(max_context) + o.block_size - 1) / o.block_size;
  o.sliding_blocks = KvCache::sliding_blocks_per_sequence(c, o.block_size, chunk_tokens);
  cache_ = std::make_unique<KvCache>(c, ckpt.weights, o);
  model_ = std::make_unique<Gemma4Model>(c, ckpt.weights, ops, comm, *cache_, chunk_tokens, kMaxLogitRows);
}

std::vector<std::vector<float>> FastSequenceModel::forward(std::span<const int32_t> tokens, bool all_positions) {
  if (blocks_.length + int64_t(tokens.size()) > max_context_)
    fail("{} tokens exceed the context of {}", blocks_.length + tokens.size(), max_context_);
  std::vector<std::vector<float>> rows;
  // Logits of a full vocabulary are large: when every position wants them, use short chunks.
  const size_t chunk = size_t(all_positions ? std::min(chunk_tokens_, kMaxLogitRows) : chunk_tokens_);
  for (size_t at = 0; at < tokens.size(); at += chunk) {
    const size_t n = std::min(tokens.size() - at, chunk);
    const bool last_chunk = at + n == tokens.size();
    StepSequence step;
    step.kv = &blocks_;
    step.tokens = tokens.subspan(at, n);
    step.logit_rows = all_positions ? int(n) : (last_chunk ? 1 : 0);
    if (!cache_->reserve(blocks_, blocks_.length + int(n))) fail("KV cache exhausted");
    model_->forward(std::span(&step, 1));
    for (uint8_t bad : model_->non_finite_rows())
      if (bad)
        fail("the model produced a non-finite value (NaN or Inf) in its final hidden state: the checkpoint holds "
             "non-finite weights, or the arithmetic overflowed");
    const int64_t local = model_->vocab_local();
    const int ranks = comm_.size();
    for (int r = 0; r < model_->logit_rows(); ++r) {
      if (ranks == 1) {
        rows.emplace_back(model_->logits(r), model_->logits(r) + local);
        continue;
      }
      // Each rank holds an equal slice of the vocabulary, in rank order.
      gathered_.resize(size_t(local) * size_t(ranks));
      comm_.all_gather(model_->logits(r), gathered_.data(), size_t(local) * sizeof(float));
      rows.emplace_back(gathered_.begin(), gathered_.end());
    }
  }
  return rows;
}

void FastSequenceModel::reset() { cache_->release(blocks_); }

}  // namespace tandem
