#pragma once
// Token strings by id and ids by string, for a vocabulary of a few hundred thousand tokens: all
// strings live in one arena and the reverse lookup is an open-addressing table, so that building it
// from tokenizer.json takes milliseconds and a lookup touches one or two cache lines.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/huge_page_allocator.h"

namespace tandem::tok {

inline uint64_t hash_bytes(std::string_view s) {
  // Eight bytes at a time with a multiply-xorshift mix; tokens are short, so this beats byte-wise
  // hashes by a wide margin and is plenty for a table that compares the full key anyway.
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xFF51AFD7ED558CCDull);
  const char* p = s.data();
  size_t n = s.size();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
  }
  h ^= h >> 32;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 29;
  return h;
}

class TokenTable {
 public:
  void reserve(size_t tokens, size_t bytes);

  // Binds `id` to `text` both ways. A text bound again keeps the newer id, and an id bound again
  // keeps the newer text (later entries win, as in a JSON object read by Hugging Face).
  void set(int32_t id, std::string_view text) { set(id, text, hash_bytes(text)); }
  void set(int32_t id, std::string_view text, uint64_t hash);  // hash == hash_bytes(text)

  std::optional<int32_t> find(std::string_view text) const { return find(text, hash_bytes(text)); }
  std::optional<int32_t> find(std::string_view text, uint64_t hash) const;

  // Starts loading the slot that `hash` probes first. Loading tokenizer.json does its lookups in
  // batches, hash-and-prefetch then look up, so that the cache misses overlap instead of queueing.
  void prefetch(uint64_t hash) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[hash & (slots_.size() - 1)]);
  }

  // The text of `id`, or nullopt for ids never bound (holes) and ids out of range.
  std::optional<std::string_view> text(int32_t id) const;
  // One past the largest id bound.
  int32_t size() const { return static_cast<int32_t>(by_id_.size()); }

 private:
  struct Span {
    uint32_t offset = kNone;
    uint32_t length = 0;
  };
  struct Slot {
    uint32_t offset;
    uint32_t length;
    int32_t id;  // -1: empty
    uint32_t hash_tag;
  };
  static constexpr uint32_t kNone = 0xFFFFFFFFu;

  std::string_view view(uint32_t offset, uint32_t length) const { return {arena_.data() + offset, length}; }
  void grow();
  void rehash(size_t slot_count);
  Slot* locate(std::string_view text, uint64_t hash);

  std::string arena_;
  std::vector<Span> by_id_;
  std::vector<Slot, HugePageAllocator<Slot>> slots_;  // power-of-two size, at most 3/4 full
  size_t used_ = 0;
};

}  // namespace tandem::tok
