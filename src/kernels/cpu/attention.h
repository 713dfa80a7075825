#pragma once
// Attention over the paged KV cache for a whole batch: each query row attends to the keys its
// position may see (causal, or a sliding window), with a numerically safe online softmax over
// blocks of keys. Work is split over (sequence, KV head, row tile), and for single-row decode of
// long contexts also over key ranges whose partial softmax states are merged afterwards.
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "kernels/ops.h"

namespace tandem::cpu {

void paged_attention(ThreadPool& pool, const KernelTable& k, const AttentionBatch& batch, std::vector<float>& scratch);

}  // namespace tandem::cpu
