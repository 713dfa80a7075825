#include "tokenizer/token_table.h"

#include <algorithm>
#include <bit>

namespace tandem::tok {

void TokenTable::reserve(size_t tokens, size_t bytes) {
  arena_.reserve(bytes);
  by_id_.reserve(tokens);
  const size_t wanted = std::bit_ceil(std::max<size_t>(16, tokens * 4 / 3 + 1));
  if (wanted > slots_.size()) rehash(wanted);
}

void TokenTable::grow() { rehash(std::max<size_t>(16, slots_.size() * 2)); }

void TokenTable::rehash(size_t slot_count) {
  std::vector<Slot, HugePageAllocator<Slot>> old = std::move(slots_);
  slots_.assign(slot_count, Slot{0, 0, -1, 0});
  for (const Slot& s : old)
    if (s.id >= 0) *locate(view(s.offset, s.length), hash_bytes(view(s.offset, s.length))) = s;
}

TokenTable::Slot* TokenTable::locate(std::string_view text, uint64_t hash) {
  const size_t mask = slots_.size() - 1;
  const uint32_t tag = static_cast<uint32_t>(hash >> 32);
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    Slot& s = slots_[i];
    if (s.id < 0) return &s;
    if (s.hash_tag == tag && s.length == text.size() && view(s.offset, s.length) == text) return &s;
  }
}

void TokenTable::set(int32_t id, std::string_view text, uint64_t hash) {
  if (slots_.empty() || (used_ + 1) * 4 > slots_.size() * 3) grow();
  Slot* slot = locate(text, hash);
  if (slot->id < 0) {
    const auto offset = static_cast<uint32_t>(arena_.size());
    arena_.append(text);
    *slot = Slot{offset, static_cast<uint32_t>(text.size()), id, static_cast<uint32_t>(hash >> 32)};
    ++used_;
  } else {
    slot->id = id;
  }
  if (static_cast<size_t>(id) >= by_id_.size()) by_id_.resize(static_cast<size_t>(id) + 1);
  by_id_[id] = Span{slot->offset, slot->length};
}

std::optional<int32_t> TokenTable::find(std::string_view text, uint64_t hash) const {
  if (slots_.empty()) return std::nullopt;
  const uint32_t tag = static_cast<uint32_t>(hash >> 32);
  const size_t mask = slots_.size() - 1;
  for (size_t i = hash & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.id < 0) return std::nullopt;
    if (s.hash_tag == tag && s.length == text.size() && view(s.offset, s.length) == text) return s.id;
  }
}

std::optional<std::string_view> TokenTable::text(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= by_id_.size()) return std::nullopt;
  const Span& span = by_id_[id];
  if (span.offset == kNone) return std::nullopt;
  return view(span.offset, span.length);
}

}  // namespace tandem::tok
