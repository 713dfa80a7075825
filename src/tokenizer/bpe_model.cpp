#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>

#include "tokenizer/utf8.h"

namespace tandem::tok {

namespace {

constexpr uint32_t kWordStart = 0x2581;  // "▁", SentencePiece's space
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
// Up to this many symbols the merge loop rescans a small array (cache friendly, no heap); longer
// chunks use a heap over a linked list, O(n log n).
constexpr size_t kShortChunk = 48;

constexpr Merge kNoMerge{INT_MAX, -1};

}  // namespace

CharTable::CharTable() : index_((kMaxCodePoint >> 8) + 1, 0), blocks_(256, -1) {}

void CharTable::set(uint32_t code_point, int32_t id) {
  if (code_point > kMaxCodePoint) return;
  uint16_t& block = index_[code_point >> 8];
  if (block == 0) {
    block = static_cast<uint16_t>(blocks_.size() >> 8);
    blocks_.resize(blocks_.size() + 256, -1);
  }
  blocks_[(size_t(block) << 8) | (code_point & 0xFF)] = id;
}

BpeModel::BpeModel() { std::fill(std::begin(byte_tokens), std::end(byte_tokens), -1); }

void BpeModel::add_glue_before_word_start(uint32_t code_point) {
  auto it = std::lower_bound(glue_before_word_start_.begin(), glue_before_word_start_.end(), code_point);
  if (it == glue_before_word_start_.end() || *it != code_point) glue_before_word_start_.insert(it, code_point);
}

bool BpeModel::glues_before_word_start(uint32_t code_point) const {
  return std::binary_search(glue_before_word_start_.begin(), glue_before_word_start_.end(), code_point);
}

// Why chunks: BPE symbols only ever grow into vocabulary tokens, so where two adjacent characters
// appear together in no token, no merge can cross between them, and the two sides merge exactly
// as they would alone. In a SentencePiece vocabulary almost no token has "▁" after another
// character, so the text between word starts ("▁") is such a chunk: short runs for the merge loop
// instead of one long line. The characters that do precede "▁" inside some token (Gemma: ">" in
// ">▁</") are recorded at load time and never split.
void BpeModel::encode_word(std::string_view word, const TokenTable& vocab, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (options.ignore_merges) {
    if (auto id = vocab.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  thread_local std::vector<Symbol> symbols;
  symbols.clear();
  const size_t word_begin = out.size();
  const auto* p = reinterpret_cast<const unsigned char*>(word.data());
  uint32_t previous = kWordStart;
  for (size_t i = 0; i < word.size();) {
    const int length = utf8::sequence_length(p[i]);
    const uint32_t cp = utf8::decode_valid(p + i, length);
    if (cp == kWordStart && previous != kWordStart && !symbols.empty() && !glues_before_word_start(previous)) {
      encode_chunk(word, symbols, word_begin, out);
      symbols.clear();
    }
    symbols.push_back(Symbol{chars.get(cp), static_cast<uint32_t>(i), static_cast<uint32_t>(length)});
    previous = cp;
    i += length;
  }
  encode_chunk(word, symbols, word_begin, out);
}

void BpeModel::encode_chunk(std::string_view word, std::vector<Symbol>& symbols, size_t word_begin,
                            std::vector<int32_t>& out) const {
  if (symbols.size() > kShortChunk) {
    merge_long(symbols);  // leaves dead symbols (length 0) in place
  } else if (symbols.size() > 1) {
    merge_short(symbols);
  }
  for (const Symbol& s : symbols)
    if (s.length > 0) emit(word, s, word_begin, out);
}

// Merges lowest rank first, leftmost first among equal ranks: exactly Hugging Face's order.
// pairs[i] is the merge of symbols i and i+1; the last entry is a sentinel that never merges.
void BpeModel::merge_short(std::vector<Symbol>& symbols) const {
  thread_local std::vector<Merge> pairs;
  const size_t n = symbols.size();
  pairs.resize(n);
  for (size_t i = 0; i + 1 < n; ++i) {
    const Merge* m = merges.find(symbols[i].id, symbols[i + 1].id);
    pairs[i] = m ? *m : kNoMerge;
  }
  pairs[n - 1] = kNoMerge;
  for (;;) {
    size_t best = 0;
    int32_t best_rank = INT_MAX;
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (pairs[i].rank < best_rank) {
        best_rank = pairs[i].rank;
        best = i;
      }
    if (best_rank == INT_MAX) return;
    symbols[best].id = pairs[best].result;
    symbols[best].length += symbols[best + 1].length;
    symbols.erase(symbols.begin() + best + 1);
    pairs.erase(pairs.begin() + best + 1);
    const auto refresh = [&](size_t i) {
      const Merge* m = i + 1 < symbols.size() ? merges.find(symbols[i].id, symbols[i + 1].id) : nullptr;
      pairs[i] = m ? *m : kNoMerge;
    };
    refresh(best);
    if (best > 0) refresh(best - 1);
  }
}

void BpeModel::merge_long(std::vector<Symbol>& symbols) const {
  struct Candidate {
    int32_t rank;
    int32_t position;  // of the left symbol; symbols keep their original order
    int32_t left_id;
    int32_t right_id;
    int32_t result;
  };
  // std heap functions keep the largest on top: "larger" here means later to merge.
  const auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.position > b.position;
  };
  thread_local std::vector<Candidate> heap;
  thread_local std::vector<int32_t> next, previous;
  const auto n = static_cast<int32_t>(symbols.size());
  heap.clear();
  next.resize(n);
  previous.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    previous[i] = i - 1;
  }
  const auto offer = [&](int32_t left) {
    const int32_t right = next[left];
    if (right < 0) return;
    if (const Merge* m = merges.find(symbols[left].id, symbols[right].id)) {
      heap.push_back(Candidate{m->rank, left, symbols[left].id, symbols[right].id, m->result});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i)
    if (const Merge* m = merges.find(symbols[i].id, symbols[i + 1].id))
      heap.push_back(Candidate{m->rank, i, symbols[i].id, symbols[i + 1].id, m->result});
  std::make_heap(heap.begin(), heap.end(), later);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    const Candidate c = heap.back();
    heap.pop_back();
    // Stale candidates: a side has merged since (its id changed) or the left one was absorbed.
    Symbol& left = symbols[c.position];
    if (left.length == 0 || left.id != c.left_id) continue;
    const int32_t right_index = next[c.position];
    if (right_index < 0 || symbols[right_index].id != c.right_id) continue;
    Symbol& right = symbols[right_index];
    left.id = c.result;
    left.length += right.length;
    right.length = 0;
    next[c.position] = next[right_index];
    if (next[c.position] >= 0) previous[next[c.position]] = c.position;
    if (previous[c.position] >= 0) offer(previous[c.position]);
    offer(c.position);
  }
}

void BpeModel::emit(std::string_view word, const Symbol& symbol, size_t word_begin,
                    std::vector<int32_t>& out) const {
  if (symbol.id >= 0) {
    out.push_back(symbol.id);
    return;
  }
  const std::string_view bytes = word.substr(symbol.start, symbol.length);
  if (options.byte_fallback) {
    bool all_present = true;
    for (unsigned char b : bytes) all_present = all_present && byte_tokens[b] >= 0;
    if (all_present) {
      for (unsigned char b : bytes) out.push_back(byte_tokens[b]);
      return;
    }
  }
  if (options.unk_id < 0) return;  // no unknown token: the character is dropped, as the peer does
  if (options.fuse_unk && out.size() > word_begin && out.back() == options.unk_id) return;
  out.push_back(options.unk_id);
}

}  // namespace tandem::tok
