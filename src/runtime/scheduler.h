#pragma once
// Continuous batching: decides, before every step, which tokens of which sequences run. Decodes of
// running sequences come first (one token each), then prefill chunks of sequences still reading
// their prompt, then new sequences are admitted from the waiting queue while slots, KV blocks and
// the step's token budget last. When the KV pool runs dry, the most recently admitted sequence is
// preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
// from its prompt and the tokens it already produced (exact, so greedy output does not change).
#include <cstdint>
#include <deque>
#include <vector>

#include "runtime/step_plan.h"
#include "runtime/worker.h"

namespace tandem {

struct ScheduledSequence {
  uint64_t id = 0;
  int slot = -1;                 // -1 while waiting
  std::vector<int32_t> tokens;   // prompt, then every generated token
  int computed = 0;              // leading tokens whose K/V are in the slot's cache
  int preemptions = 0;
};

class Scheduler {
 public:
  Scheduler(const Worker& worker, int max_slots, int max_step_tokens);

  // Builds the next plan. Moves admitted sequences from `waiting` to the back of `running` and
  // preempted ones from `running` to the front of `waiting`; `released` lists slots to free first
  // (finished or cancelled sequences). Returns the sequences that run, in plan order.
  std::vector<ScheduledSequence*> plan(std::deque<ScheduledSequence*>& waiting, std::vector<ScheduledSequence*>& running,
                                       const std::vector<int>& released, StepPlan& out);

  int free_slots() const { return int(free_slots_.size()); }
  void release_slot(int slot) { free_slots_.push_back(slot); }
  uint64_t preemptions() const { return preemptions_; }

 private:
  const Worker& worker_;
  int max_step_tokens_;
  std::vector<int> free_slots_;
  uint64_t preemptions_ = 0;
};

}  // namespace tandem
