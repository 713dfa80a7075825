#pragma once
// Continuous batching: decides, before every step, which tokens of which sequences run. Decodes of
// running sequences come first (one token each), then prefill chunks of sequences still reading
// their prompt, then new sequences are admitted from the waiting queue while slots, KV blocks and
// the step's token budget last. When the KV pool runs dry, the most recently admitted sequence is
// preempted: its blocks are freed and it goes back to the front of the queue, to be recomputed
// from its prompt and the tokens it already produced (exact, so greedy output does not change).
//
// Prefix reuse: a slot whose sequence ended keeps its KV blocks and remembers their tokens. A new
// sequence whose prompt starts with some of those tokens takes that slot, cut back to the shared
// prefix, and prefills only the rest: the next turn of a chat re-sends the whole conversation, and
// only its new message is computed. The result is what a chunked prefill with a chunk boundary at
// the prefix would give. Kept blocks are given back, least recently used first, as soon as a
// running sequence or an admission needs them.
//
// A prompt may also start from another slot's prefix (a running sequence's, or a kept one it does
// not take): the n choices of one request, or concurrent chats that share a long system prompt. It
// shares the full-attention blocks the prefix fills and copies the rest (KvCache::copy_prefix), so
// the scheduler counts a block as freed only when its last holder lets go of it. A waiting prompt
// that shares at least kMinCopiedPrefix tokens with a sequence still prefilling them waits for that
// prefill instead of computing the same tokens beside it.
#include <cstdint>
#include <deque>
#include <span>
#include <utility>
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
  int reused = -1;               // prompt tokens taken from the prefix cache at first admission; -1 before
  bool score_prompt = false;     // every token gets a logit row (prompt logprobs); never reuses a prefix
  int prompt_length = 0;         // of tokens, the prompt's (its sliding window is pinned for reuse)
};

class Scheduler {
 public:
  // The shortest shared prefix worth a copy (and worth waiting for).
  static constexpr int kMinCopiedPrefix = 32;

  Scheduler(const Worker& worker, int max_slots, int max_step_tokens, bool prefix_reuse);

  // Builds the next plan. Moves admitted sequences from `waiting` to the back of `running` and
  // preempted ones from `running` to the front of `waiting`, and gives back the blocks of ended
  // sequences (end()). Returns the sequences that run, in plan order.
  std::vector<ScheduledSequence*> plan(std::deque<ScheduledSequence*>& waiting, std::vector<ScheduledSequence*>& running,
                                       StepPlan& out);

  // `seq` (which holds a slot) has ended. With `keep` (it ended between steps, so its cache holds
  // exactly its first `computed` tokens), the slot keeps them for reuse; otherwise its blocks go
  // back at the next plan.
  void end(ScheduledSequence& seq, bool keep);
  bool has_releases() const { return !released_.empty(); }

  int free_slots() const { return int(free_slots_.size()); }
  uint64_t preemptions() const { return preemptions_; }
  // Blocks held only for reuse, by slots with no running sequence: free for any sequence that needs them.
  int64_t kept_blocks() const;
  uint64_t reuse_queries() const { return reuse_queries_; }  // prompt tokens of first admissions
  uint64_t reuse_hits() const { return reuse_hits_; }        // of those, tokens taken from kept blocks

 private:
  struct KeptPrefix {
    std::vector<int32_t> tokens;  // empty: the slot holds nothing
    uint64_t last_used = 0;
  };
  // The prefix of `tokens` that blocks `held`, holding `held_tokens`, can give (at most all but the
  // last token: one must run to give logits), 0 when their sliding window has moved past it.
  int reusable(const KvSequenceBlocks& held, std::span<const int32_t> held_tokens, const std::vector<int32_t>& tokens) const;
  int reusable(int slot, const std::vector<int32_t>& tokens) const;
  // The free slot a sequence of `tokens` takes, and the prefix of them it already holds (0 without `reuse`).
  std::pair<int, int> choose_slot(const std::vector<int32_t>& tokens, bool reuse) const;

  const Worker& worker_;
  int max_step_tokens_;
  bool prefix_reuse_;
  std::vector<int> free_slots_;
  std::vector<int> released_;  // slots whose blocks go back at the next plan
  std::vector<KeptPrefix> kept_;
  uint64_t clock_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t reuse_queries_ = 0, reuse_hits_ = 0;
};

}  // namespace tandem
