#include "runtime/scheduler.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace tandem {

Scheduler::Scheduler(const Worker& worker, int max_slots, int max_step_tokens, bool prefix_reuse)
    : worker_(worker), max_step_tokens_(max_step_tokens), prefix_reuse_(prefix_reuse), kept_(size_t(max_slots)) {
  if (max_step_tokens < max_slots) fail("a step must fit one token of every running sequence");
  for (int s = max_slots - 1; s >= 0; --s) free_slots_.push_back(s);
}

void Scheduler::end(ScheduledSequence& seq, bool keep) {
  const int slot = seq.slot;
  if (keep && prefix_reuse_ && seq.computed > 0) {
    KeptPrefix& k = kept_[size_t(slot)];
    k.tokens.assign(seq.tokens.begin(), seq.tokens.begin() + seq.computed);
    k.last_used = ++clock_;
  } else {
    released_.push_back(slot);
  }
  free_slots_.push_back(slot);
  seq.slot = -1;
}

namespace {
int64_t held_blocks(const KvSequenceBlocks& b) { return int64_t(b.full.size() + b.sliding.size() + b.pinned.size()); }
}  // namespace

int64_t Scheduler::kept_blocks() const {
  // A kept prefix's full-attention blocks may be shared with running sequences or other kept ones: a
  // shared block counts where all its holders are kept.
  const KvCache& cache = worker_.cache();
  std::vector<int32_t> shared;
  int64_t blocks = 0;
  for (size_t s = 0; s < kept_.size(); ++s) {
    if (kept_[s].tokens.empty()) continue;
    const KvSequenceBlocks& b = worker_.slot(int(s));
    blocks += int64_t(b.sliding.size() + b.pinned.size());
    for (int32_t block : b.full)
      if (cache.full_block_holders(block) == 1) ++blocks;
      else shared.push_back(block);
  }
  std::sort(shared.begin(), shared.end());
  for (size_t i = 0, j = 0; i < shared.size(); i = j) {
    while (j < shared.size() && shared[j] == shared[i]) ++j;
    blocks += int64_t(j - i) == cache.full_block_holders(shared[i]);
  }
  return blocks;
}

namespace {
size_t shared_prefix(std::span<const int32_t> a, std::span<const int32_t> b, size_t limit) {
  limit = std::min({limit, a.size(), b.size()});
  size_t shared = 0;
  while (shared < limit && a[shared] == b[shared]) ++shared;
  return shared;
}
}  // namespace

int Scheduler::reusable(const KvSequenceBlocks& held, std::span<const int32_t> held_tokens,
                        const std::vector<int32_t>& tokens) const {
  const size_t shared = shared_prefix(held_tokens, tokens, std::min(size_t(held.length), tokens.size() - 1));
  // All of it where the slot's recent window reaches; else its pinned prompt end (or one before).
  for (const int prefix : {int(shared), held.pinned_length, held.pinned_length - 1})
    if (prefix > 0 && prefix <= int(shared) && worker_.cache().truncated(held, prefix)) return prefix;
  return 0;
}

int Scheduler::reusable(int slot, const std::vector<int32_t>& tokens) const {
  return reusable(worker_.slot(slot), kept_[size_t(slot)].tokens, tokens);
}

std::vector<ScheduledSequence*> Scheduler::plan(std::deque<ScheduledSequence*>& waiting,
                                                std::vector<ScheduledSequence*>& running,
                                                StepPlan& out) {
  out.clear();
  const KvCache& cache = worker_.cache();
  int64_t free_full = cache.free_full_blocks(), free_sliding = cache.free_sliding_blocks();
  // Full-attention blocks are shared between sequences that copied a prefix (KvCache::copy_prefix),
  // so letting go of one frees it only if nobody else holds it. `holder_change` is what the
  // operations planned so far do to each block's holders.
  using HolderChange = std::unordered_map<int32_t, int32_t>;
  HolderChange holder_change;
  auto holders_after = [&](const HolderChange& change, int32_t block) {
    const auto it = change.find(block);
    return cache.full_block_holders(block) + (it == change.end() ? 0 : it->second);
  };
  // How many of `blocks` letting go of them frees, given (and recorded in) `change`. A block with one
  // holder and no change planned goes with that holder, and nothing planned later can touch it (only
  // holders give blocks to copies), so only shared blocks are recorded: the maps stay as small as the
  // sharing, whatever the contexts' lengths.
  auto let_go = [&](HolderChange& change, std::span<const int32_t> blocks) {
    int64_t freed = 0;
    for (int32_t block : blocks) {
      if (cache.full_block_holders(block) == 1 && !change.contains(block)) {
        ++freed;
        continue;
      }
      freed += holders_after(change, block) == 1;
      --change[block];
    }
    return freed;
  };
  auto give_back = [&](int slot) {
    const KvSequenceBlocks& b = worker_.slot(slot);
    free_full += let_go(holder_change, b.full);
    free_sliding += int64_t(b.sliding.size() + b.pinned.size());
    out.kv_ops.push_back({KvOp::Release, slot, 0});
  };
  // Slots empty once the released ones are given back, which can take a copied prefix.
  std::vector<int> empty_slots;
  for (int s : free_slots_)
    if (kept_[size_t(s)].tokens.empty() &&
        (held_blocks(worker_.slot(s)) == 0 || std::find(released_.begin(), released_.end(), s) != released_.end()))
      empty_slots.push_back(s);
  for (int slot : released_) give_back(slot);
  released_.clear();
  // Copies run before every other operation of the step but those releases (KvOp::Copy), so they
  // read the blocks as the step found them and take blocks that every later operation then lacks:
  // a copy fits where the free count stays above its size at every point since (low_*).
  const size_t copy_at = out.kv_ops.size();
  size_t copies = 0;
  int64_t low_full = free_full, low_sliding = free_sliding;
  // Gives back the least recently used kept prefix other than `spare`'s; false when there is none.
  auto drop_kept = [&](int spare) {
    int oldest = -1;
    for (int s : free_slots_)
      if (s != spare && !kept_[size_t(s)].tokens.empty() &&
          (oldest < 0 || kept_[size_t(s)].last_used < kept_[size_t(oldest)].last_used))
        oldest = s;
    if (oldest < 0) return false;
    give_back(oldest);
    kept_[size_t(oldest)].tokens.clear();
    return true;
  };

  std::vector<ScheduledSequence*> planned;
  int budget = max_step_tokens_;
  int logit_budget = worker_.max_logit_rows();
  // Logit rows of a chunk of `n` tokens after the first `computed` of `seq`.
  auto logit_rows_of = [&](const ScheduledSequence* seq, int computed, int n) {
    return seq->score_prompt ? n : computed + n == int(seq->tokens.size()) ? 1 : 0;
  };
  // The longest such chunk of at most `n` tokens whose logit rows fit the step's (0: none does).
  auto fit_logit_rows = [&](const ScheduledSequence* seq, int computed, int n) {
    if (seq->score_prompt) return std::min(n, logit_budget);
    return logit_rows_of(seq, computed, n) > logit_budget ? n - 1 : n;  // then not the final chunk yet
  };
  // Tries to plan `n` more tokens of `seq`, whose slot's blocks are `blocks` when the step starts;
  // false when the pools are short.
  auto try_plan = [&](ScheduledSequence* seq, int n, const KvSequenceBlocks& blocks) {
    auto [full, sliding] = cache.blocks_needed(blocks, seq->computed + n);
    if (full > free_full || sliding > free_sliding) return false;
    free_full -= full;
    free_sliding -= sliding;
    low_full = std::min(low_full, free_full);
    low_sliding = std::min(low_sliding, free_sliding);
    out.kv_ops.push_back({KvOp::Reserve, seq->slot, seq->computed + n});
    PlannedSequence p;
    p.slot = seq->slot;
    p.first_token = int32_t(out.tokens.size());
    p.token_count = n;
    p.logit_rows = logit_rows_of(seq, seq->computed, n);
    logit_budget -= p.logit_rows;
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
      const int n = fit_logit_rows(seq, seq->computed, std::min(remaining, budget));
      if (n == 0) continue;
      while (!try_plan(seq, n, worker_.slot(seq->slot))) {
        if (drop_kept(-1)) continue;
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
  const size_t running_before = running.size();  // those admitted below hold nothing yet to copy from
  // The longest prefix of `tokens` another slot can give by a copy (a running sequence's as the step
  // found it, or a kept one), as {source slot, prefix}; {-1, 0} for none of kMinCopiedPrefix or more.
  auto copy_source = [&](const std::vector<int32_t>& tokens) {
    std::pair<int, int> best{-1, 0};
    for (size_t i = 0; i < running_before; ++i) {
      const ScheduledSequence* r = running[i];
      if (r->slot < 0) continue;
      const int prefix = reusable(worker_.slot(r->slot), r->tokens, tokens);
      if (prefix > best.second) best = {r->slot, prefix};
    }
    for (int s : free_slots_)
      if (!kept_[size_t(s)].tokens.empty())
        if (const int prefix = reusable(s, tokens); prefix > best.second) best = {s, prefix};
    return best.second >= kMinCopiedPrefix ? best : std::pair{-1, 0};
  };
  // True while a running sequence still computes more of the start of `seq`'s prompt (at least
  // kMinCopiedPrefix tokens of it) than any slot can give now (`available`): in its prompt's
  // prefill, or (one token a step) at least kMinCopiedPrefix more.
  auto worth_waiting = [&](const ScheduledSequence* seq, int available) {
    for (size_t i = 0; i < running.size(); ++i) {
      const ScheduledSequence* r = running[i];
      if (r->slot < 0) continue;
      const int shared = int(shared_prefix(r->tokens, seq->tokens, seq->tokens.size() - 1));
      const int held = i < running_before ? worker_.slot(r->slot).length : 0;
      if (shared < kMinCopiedPrefix || shared <= available || held >= shared) continue;
      if (held < r->prompt_length || shared - available >= kMinCopiedPrefix) return true;
    }
    return false;
  };

  for (size_t w = 0; w < waiting.size() && !free_slots_.empty() && budget > 0;) {
    ScheduledSequence* seq = waiting[w];
    if (std::find(preempted.begin(), preempted.end(), seq) != preempted.end()) break;
    const bool reuse = prefix_reuse_ && !seq->score_prompt;
    auto [slot, prefix] = choose_slot(seq->tokens, reuse);
    int source = -1;
    bool give_up_target = false;  // the copy's target is a kept slot, given up once the admission is sure
    int64_t freed_full = 0, freed_sliding = 0;
    if (reuse) {
      // A longer prefix from a copy goes into an empty slot, else into the least recently used kept
      // one (not the source), whose blocks then go back before the copy runs.
      const auto [from, copied] = copy_source(seq->tokens);
      int target = -1;
      if (copied > prefix) {
        const auto empty = std::find_if(empty_slots.begin(), empty_slots.end(), [&](int s) {
          return std::find(free_slots_.begin(), free_slots_.end(), s) != free_slots_.end();
        });
        if (empty != empty_slots.end()) {
          target = *empty;
        } else {
          for (int s : free_slots_)
            if (s != from && !kept_[size_t(s)].tokens.empty() &&
                (target < 0 || kept_[size_t(s)].last_used < kept_[size_t(target)].last_used))
              target = s;
          give_up_target = target >= 0;
        }
      }
      if (give_up_target) {
        const KvSequenceBlocks& b = worker_.slot(target);
        HolderChange peek = holder_change;
        freed_full = let_go(peek, b.full);
        freed_sliding = int64_t(b.sliding.size() + b.pinned.size());
      }
      bool copies_fit = false;
      if (target >= 0) {
        const auto [full, sliding] = *cache.copy_blocks_needed(worker_.slot(from), copied);
        copies_fit = full <= low_full + freed_full && sliding <= low_sliding + freed_sliding;
      }
      if (worth_waiting(seq, copies_fit ? copied : prefix)) {
        ++w;
        continue;
      }
      if (copies_fit) slot = target, prefix = copied, source = from;
      else give_up_target = false, freed_full = freed_sliding = 0;
    }
    const int n = fit_logit_rows(seq, prefix, std::min(int(seq->tokens.size()) - prefix, budget));
    if (n == 0) break;
    const KvSequenceBlocks& held = worker_.slot(source >= 0 ? source : slot);
    const bool holds = source < 0 && !kept_[size_t(slot)].tokens.empty();
    const KvSequenceBlocks start = prefix > 0 ? *cache.truncated(held, prefix) : KvSequenceBlocks{};
    // A copy takes the blocks it copies and shares the others; taking a slot gives back what it
    // keeps past the prefix (less a block to copy where the cut falls inside a shared one); other
    // slots' kept prefixes can go too.
    const auto [copy_full, copy_sliding] =
        source >= 0 ? *cache.copy_blocks_needed(held, prefix) : std::pair<int64_t, int64_t>{0, 0};
    const std::span<const int32_t> shared_full(start.full.data(), source >= 0 ? start.full.size() - size_t(copy_full) : 0);
    // The cut: the blocks it frees, and the block it copies first where it falls inside a shared one.
    HolderChange after_cut;
    int64_t cut_freed = 0, cut_copy = 0;
    auto plan_cut = [&] {
      after_cut = holder_change;
      if (!holds) return;
      cut_copy = cache.truncate_blocks_needed(held, prefix, [&](int32_t b) { return holders_after(holder_change, b); });
      cut_freed = let_go(after_cut, std::span(held.full).subspan(start.full.size()));
    };
    plan_cut();
    const int64_t cut_full = cut_freed - cut_copy;
    const int64_t cut_sliding = holds ? int64_t(held.sliding.size() + held.pinned.size() - start.sliding.size()) : 0;
    int64_t droppable_full = 0, droppable_sliding = 0;
    HolderChange after_drops = after_cut;
    for (int32_t block : shared_full) ++after_drops[block];
    for (int s : free_slots_)
      if (s != slot && !kept_[size_t(s)].tokens.empty()) {
        droppable_full += let_go(after_drops, worker_.slot(s).full);
        droppable_sliding += int64_t(worker_.slot(s).sliding.size() + worker_.slot(s).pinned.size());
      }
    auto [whole_full, whole_sliding] = cache.blocks_needed(start, int(seq->tokens.size()));
    // A sequence never holds more than its share of the sliding pool, which a free slot always has:
    // a long prompt's older sliding blocks are given back as its chunks go on.
    whole_sliding = std::min(whole_sliding, cache.options().sliding_blocks_per_sequence - int64_t(start.sliding.size()));
    whole_full += copy_full;
    whole_sliding += copy_sliding;
    // (With nothing running it goes in regardless: requests are checked against the context limit,
    // and waiting could not make room.)
    if ((whole_full > free_full + freed_full + cut_full + droppable_full ||
         whole_sliding > free_sliding + freed_sliding + cut_sliding + droppable_sliding) &&
        !running.empty())
      break;
    if (holds) {
      // The cut's copy needs a block when it runs (after the step's earlier operations, with those the
      // cut frees): kept prefixes go first where there is none, which may also leave the block unshared.
      while (cut_copy > free_full + cut_freed && drop_kept(slot)) plan_cut();
      if (cut_copy > free_full + cut_freed) break;
      out.kv_ops.push_back(prefix > 0 ? KvOp{KvOp::Truncate, slot, prefix} : KvOp{KvOp::Release, slot, 0});
      holder_change = std::move(after_cut);
      if (cut_copy > 0) --holder_change[held.full[start.full.size() - 1]];  // the cut's own copy instead
      free_full += cut_freed - cut_copy;
      free_sliding += cut_sliding;
      low_full = std::min(low_full, free_full);
      kept_[size_t(slot)].tokens.clear();
    }
    if (give_up_target) {
      out.kv_ops.insert(out.kv_ops.begin() + int64_t(copy_at + copies++), KvOp{KvOp::Release, slot, 0});
      let_go(holder_change, worker_.slot(slot).full);
      free_full += freed_full, free_sliding += freed_sliding;
      low_full += freed_full, low_sliding += freed_sliding;
      kept_[size_t(slot)].tokens.clear();
    }
    if (source >= 0) {
      // A kept prefix that feeds copies is in use: the last to be given back.
      if (!kept_[size_t(source)].tokens.empty()) kept_[size_t(source)].last_used = ++clock_;
      out.kv_ops.insert(out.kv_ops.begin() + int64_t(copy_at + copies++), KvOp{KvOp::Copy, slot, prefix, source});
      for (int32_t block : shared_full) ++holder_change[block];
      free_full -= copy_full, free_sliding -= copy_sliding;
      low_full -= copy_full, low_sliding -= copy_sliding;
    }
    while ((whole_full - copy_full > free_full || whole_sliding - copy_sliding > free_sliding) && drop_kept(slot)) {
    }
    free_slots_.erase(std::find(free_slots_.begin(), free_slots_.end(), slot));
    seq->slot = slot;
    seq->computed = prefix;
    if (seq->reused < 0) {
      seq->reused = prefix;
      if (!seq->score_prompt) {  // it never looks (vLLM leaves such requests out of these counts too)
        reuse_queries_ += seq->tokens.size();
        reuse_hits_ += uint64_t(prefix);
      }
    }
    if (!try_plan(seq, n, start)) {  // only when nothing runs and even the first chunk is too long
      out.kv_ops.push_back({KvOp::Release, slot, 0});
      free_slots_.push_back(slot);
      seq->slot = -1;
      seq->computed = 0;
      break;
    }
    if (prefix_reuse_ && !seq->score_prompt) out.kv_ops.push_back({KvOp::Pin, slot, seq->prompt_length});
    waiting.erase(waiting.begin() + int64_t(w));
    running.push_back(seq);
  }
  return planned;
}

std::pair<int, int> Scheduler::choose_slot(const std::vector<int32_t>& tokens, bool reuse) const {
  // A match that is most of what its slot keeps, or its request's whole prompt, is taken; a short one
  // (the same system prompt, another conversation after it) only when no empty slot is left, since
  // taking it gives back the rest.
  int longest = -1, longest_prefix = 0, worth = -1, worth_prefix = 0, empty = -1, oldest = -1;
  for (auto it = free_slots_.rbegin(); it != free_slots_.rend(); ++it) {
    const int s = *it;
    const KeptPrefix& k = kept_[size_t(s)];
    if (k.tokens.empty()) {
      if (empty < 0) empty = s;
      continue;
    }
    if (oldest < 0 || k.last_used < kept_[size_t(oldest)].last_used) oldest = s;
    const int prefix = reuse ? reusable(s, tokens) : 0;
    if (prefix > longest_prefix) longest = s, longest_prefix = prefix;
    // Its request's whole prompt (less at most the last token: the same prompt again) is worth it too:
    // the same conversation going on after an answer, however long.
    const bool whole_prompt = prefix + 1 >= worker_.slot(s).pinned_length && worker_.slot(s).pinned_length > 0;
    if (prefix > worth_prefix && (2 * size_t(prefix) >= k.tokens.size() || whole_prompt)) worth = s, worth_prefix = prefix;
  }
  if (worth >= 0) return {worth, worth_prefix};
  if (empty >= 0) return {empty, 0};
  if (longest >= 0) return {longest, longest_prefix};
  return {oldest, 0};
}

}  // namespace tandem
