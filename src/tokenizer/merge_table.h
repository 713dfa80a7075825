#pragma once
// BPE merge ranks keyed by the pair of token ids being merged. This lookup is the inner loop of
// encoding (one per adjacent pair, and two more per merge), so it is a flat open-addressing table
// of 16-byte slots rather than a node-based map.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <vector>

#include "tokenizer/huge_page_allocator.h"

namespace tandem::tok {

struct Merge {
  int32_t rank;    // position in tokenizer.json's merge list: lower merges first
  int32_t result;  // id of the merged token
};

class MergeTable {
 public:
  void reserve(size_t merges) {
    slots_.assign(std::bit_ceil(std::max<size_t>(16, merges * 2)), Slot{kEmpty, {0, 0}});
    used_ = 0;
  }

  // A pair listed twice keeps its later rank, as Hugging Face's loader does.
  void insert(int32_t left, int32_t right, Merge merge) {
    if ((used_ + 1) * 2 > slots_.size()) rehash(std::max<size_t>(16, slots_.size() * 2));
    Slot& slot = locate(key(left, right));
    if (slot.key == kEmpty) ++used_;
    slot = Slot{key(left, right), merge};
  }

  // nullptr when the pair never merges. Negative ids (characters outside the vocabulary) never do.
  const Merge* find(int32_t left, int32_t right) const {
    if ((left | right) < 0 || slots_.empty()) return nullptr;
    const uint64_t k = key(left, right);
    const size_t mask = slots_.size() - 1;
    for (size_t i = mix(k) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.key == k) return &s.merge;
      if (s.key == kEmpty) return nullptr;
    }
  }

  // See TokenTable::prefetch.
  void prefetch(int32_t left, int32_t right) const {
    __builtin_prefetch(&slots_[mix(key(left, right)) & (slots_.size() - 1)]);
  }

  size_t size() const { return used_; }

 private:
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  static uint64_t key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
  }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 31;
    k *= 0x9E3779B97F4A7C15ull;
    return k ^ (k >> 32);
  }
  Slot& locate(uint64_t k) {
    const size_t mask = slots_.size() - 1;
    for (size_t i = mix(k) & mask;; i = (i + 1) & mask)
      if (slots_[i].key == k || slots_[i].key == kEmpty) return slots_[i];
  }
  void rehash(size_t slot_count) {
    std::vector<Slot, HugePageAllocator<Slot>> old = std::move(slots_);
    slots_.assign(slot_count, Slot{kEmpty, {0, 0}});
    for (const Slot& s : old)
      if (s.key != kEmpty) locate(s.key) = s;
  }

  std::vector<Slot, HugePageAllocator<Slot>> slots_;
  size_t used_ = 0;
};

}  // namespace tandem::tok
