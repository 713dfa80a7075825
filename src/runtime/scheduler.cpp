#include "runtime/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace tandem {

Scheduler::Scheduler(const Worker& worker, int max_slots, int max_step_tokens)
    : worker_(worker), max_step_tokens_(max_step_tokens) {
  if (max_step_tokens < max_slots) fail("a step must fit one token of every running sequence");
  for (int s = max_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

std::vector<ScheduledSequence*> Scheduler::plan(std::deque<ScheduledSequence*>& waiting,
                                                std::vector<ScheduledSequence*>& running,
                                                const std::vector<int>& released, StepPlan& out) {
  out.clear();
  const KvCache& cache = worker_.cache();
  int64_t free_full = cache.free_full_blocks(), free_sliding = cache.free_sliding_blocks();
  auto give_back = [&](int slot) {
    const KvSequenceBlocks& b = worker_.slot(slot);
    free_full += int64_t(b.full.size());
    free_sliding += int64_t(b.sliding.size());
    out.kv_ops.push_back({KvOp::Release, slot, 0});
  };
  for (int slot : released) give_back(slot);

  std::vector<ScheduledSequence*> planned;
  int budget = max_step_tokens_;
  // Tries to plan `n` more tokens of `seq`; false when the pools are short.
  auto try_plan = [&](ScheduledSequence* seq, int n) {
    const KvSequenceBlocks empty;
    const KvSequenceBlocks& blocks = seq->computed == 0 ? empty : worker_.slot(seq->slot);
    auto [full, sliding] = cache.blocks_needed(blocks, seq->computed + n);
    if (full > free_full || sliding > free_sliding) return false;
    free_full -= full;
    free_sliding -= sliding;
    out.kv_ops.push_back({KvOp::Reserve, seq->slot, seq->computed + n});
    PlannedSequence p;
    p.slot = seq->slot;
    p.first_token = int32_t(out.tokens.size());
    p.token_count = n;
    p.logit_rows = seq->computed + n == int(seq->tokens.size()) ? 1 : 0;
    out.tokens.insert(out.tokens.end(), seq->tokens.begin() + seq->computed, seq->tokens.begin() + seq->computed + n);
    out.sequences.push_back(p);
    seq->computed += n;
    planned.push_back(seq);
    budget -= n;
    return true;
  };
  auto is_planned = [&](ScheduledSequence* s) { return std::find(planned.begin(), planned.end(), s) != planned.end(); };
  std::vector<ScheduledSequence*> preempted;  // in this plan
  // Frees the newest running sequence that has no tokens in this plan yet.
  auto preempt_newest = [&]() -> ScheduledSequence* {
    for (auto it = running.rbegin(); it != running.rend(); ++it) {
      ScheduledSequence* victim = *it;
      if (is_planned(victim)) continue;
      give_back(victim->slot);
      free_slots_.push_back(victim->slot);
      victim->slot = -1;
      victim->computed = 0;
      ++victim->preemptions;
      ++preemptions_;
      running.erase(std::next(it).base());
      waiting.push_front(victim);
      preempted.push_back(victim);
      return victim;
    }
    return nullptr;
  };

  // Decodes first, then prefill chunks, oldest sequence first within each.
  const std::vector<ScheduledSequence*> order = running;  // preemption edits `running` as we go
  for (int pass = 0; pass < 2; ++pass) {
    for (ScheduledSequence* seq : order) {
      if (seq->slot < 0) continue;  // preempted earlier in this plan
      const int remaining = int(seq->tokens.size()) - seq->computed;
      if ((pass == 0) != (remaining == 1) || remaining <= 0 || budget == 0) continue;
      const int n = std::min(remaining, budget);
      while (!try_plan(seq, n)) {
        ScheduledSequence* victim = preempt_newest();
        if (!victim) fail("the KV cache cannot hold even one running sequence");
        if (victim == seq) break;
      }
    }
  }

  // Admissions, first come first served, while the step and the pools have room: room for a
  // sequence's whole prompt, not just its first chunk, and never for one preempted in this plan.
  // Admitted on its first chunk alone, a long prompt that does not fit beside a running sequence
  // was preempted as soon as that sequence grew and readmitted at once, its prefill redone every few
  // steps (a 2600-token request ran 2.6-4.8x slower beside a waiting 2000-token one, ~570 preemptions).
  while (!waiting.empty() && !free_slots_.empty() && budget > 0) {
    ScheduledSequence* seq = waiting.front();
    if (std::find(preempted.begin(), preempted.end(), seq) != preempted.end()) break;
    const auto [whole_full, whole_sliding] = cache.blocks_needed(KvSequenceBlocks{}, int(seq->tokens.size()));
    // (With nothing running it goes in regardless: requests are checked against the context limit,
    // and waiting could not make room.)
    if ((whole_full > free_full || whole_sliding > free_sliding) && !running.empty()) break;
    seq->slot = free_slots_.back();
    seq->computed = 0;
    const int n = std::min(int(seq->tokens.size()), budget);
    if (!try_plan(seq, n)) {
      seq->slot = -1;
      break;
    }
    free_slots_.pop_back();
    waiting.pop_front();
    running.push_back(seq);
  }
  return planned;
}

}  // namespace tandem
