#include "model/kv_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/huge_pages.h"

namespace tandem {

namespace {

bool owns_kv(const LayerConfig& l) { return !l.shares_kv; }

size_t block_bytes_of_kind(const Gemma4Config& c, const ModelWeights& w, const KvCacheOptions& o, AttentionKind kind) {
  size_t bytes = 0;
  for (size_t i = 0; i < c.layers.size(); ++i) {
    const LayerConfig& l = c.layers[i];
    if (!owns_kv(l) || l.kind != kind) continue;
    bytes += 2 * size_t(w.layers[i].heads.kv_count) * size_t(o.block_size) * size_t(l.head_dim) * kv_dtype_size(o.dtype);
  }
  return bytes;
}

}  // namespace

size_t KvCache::full_block_bytes(const Gemma4Config& c, const ModelWeights& w, const KvCacheOptions& o) {
  return block_bytes_of_kind(c, w, o, AttentionKind::Full);
}

size_t KvCache::sliding_block_bytes(const Gemma4Config& c, const ModelWeights& w, const KvCacheOptions& o) {
  return block_bytes_of_kind(c, w, o, AttentionKind::Sliding);
}

int64_t KvCache::sliding_blocks_per_sequence(const Gemma4Config& c, int block_size, int max_chunk) {
  // A chunk starting at p0 sees positions from p0 - window + 1 on: window - 1 old ones plus the
  // chunk, which may straddle one more block boundary.
  return (int64_t(c.sliding_window) - 1 + max_chunk + block_size - 1) / block_size + 1;
}

int64_t KvCache::pinned_blocks_per_sequence(const Gemma4Config& c, int block_size) {
  // A window of `sliding_window` positions ending at p - 1 or p: window + 1 positions, over at most
  // this many blocks.
  return (int64_t(c.sliding_window) + block_size - 1) / block_size + 1;
}

KvCacheOptions KvCache::plan(const Gemma4Config& c, const ModelWeights& w, size_t budget, int max_sequences,
                             int max_chunk, int block_size, KvDType dtype, bool pin_windows) {
  KvCacheOptions o;
  o.block_size = block_size;
  o.dtype = dtype;
  const size_t sliding_bytes = sliding_block_bytes(c, w, o), full_bytes = full_block_bytes(c, w, o);
  if (sliding_bytes > 0) {
    o.sliding_blocks_per_sequence = sliding_blocks_per_sequence(c, block_size, max_chunk);
    if (pin_windows) o.pinned_blocks_per_sequence = pinned_blocks_per_sequence(c, block_size);
    o.sliding_blocks = (o.sliding_blocks_per_sequence + o.pinned_blocks_per_sequence) * max_sequences;
  }
  const size_t sliding_total = size_t(o.sliding_blocks) * sliding_bytes;
  // The sliding-window layers' windows of every sequence, and at least one block of context.
  const size_t needed = sliding_total + full_bytes;
  if (budget < needed || budget == 0)
    fail("--kv-memory of {:.2f} MiB is too small: {} sequences (--parallel) need at least {:.2f} MiB (their "
         "sliding-window layers {:.2f} MiB, and one block of context)",
         budget / 1048576.0, max_sequences, needed / 1048576.0, sliding_total / 1048576.0);
  o.full_blocks = full_bytes > 0 ? int64_t((budget - sliding_total) / full_bytes) : 0;
  return o;
}

KvDType default_kv_dtype(const ModelWeights& weights) {
  // The MLP's matrices hold most of what a token streams; a checkpoint quantizes all or none of them.
  for (const LayerWeights& l : weights.layers)
    if (is_quantized(l.gate_proj.format) || is_quantized(l.down_proj.format)) return KvDType::BF16;
  return KvDType::F32;
}

KvCache::KvCache(const Gemma4Config& config, const ModelWeights& weights, const KvCacheOptions& options)
    : config_(config), options_(options), layers_(config.layers.size()) {
  if (options.block_size < 1) fail("KV block size must be positive");
  const size_t elem = kv_dtype_size(options.dtype);
  std::vector<size_t> offsets(config.layers.size());
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& l = config.layers[i];
    if (!owns_kv(l)) continue;
    LayerStorage& s = layers_[i];
    s.head_dim = l.head_dim;
    s.kv_heads = weights.layers[i].heads.kv_count;
    // Head-major: each KV head's blocks side by side. A decode's attention items are one per KV
    // head (handed round-robin to the threads), so a sequence's blocks, handed out in order, are
    // then one run per item rather than runs broken by the other heads' (`attention_bench` Decode
    // at 32768 keys on two Zen 3 cores: f32 +4-8%, 8 sequences of 8192 +15%; docs/kernels.md).
    const int64_t blocks = l.kind == AttentionKind::Full ? options.full_blocks : options.sliding_blocks;
    s.block_stride = int64_t(options.block_size) * l.head_dim;
    s.head_stride = s.block_stride * blocks;
    offsets[i] = bytes_;
    bytes_ += 2 * size_t(blocks) * size_t(s.block_stride) * size_t(s.kv_heads) * elem;
  }
  if (bytes_ > 0) {
    // Anonymous pages: reserved now, backed by memory once a block is first written (or all at once
    // with options.prefault), 2 MB at a time where the kernel allows. Attention reads each block's
    // keys and values as streams, which on 4 KB pages miss the TLB every page: E4B q4 decode at
    // 512-560 positions (Intel Xeon, `tandem bench --profile`, two runs each way) spent 5.1-5.4 ms
    // a token in attention on 4 KB pages and 3.9-4.1 on 2 MB ones, and decoded 11.2-11.4 ->
    // 12.0 tok/s. The cost: each (layer, K or V, KV head) run of blocks is backed 2 MB at a time,
    // up to 2 MB more per run than its blocks hold (E4B: 96 runs, peak RSS 2.89 -> 3.09 GB there).
    memory_ = reserve_huge_page_region(bytes_);
    if (!memory_) fail("cannot reserve {:.1f} GiB for the KV cache", bytes_ / 1073741824.0);
  }
  for (size_t i = 0; i < config.layers.size(); ++i) {
    const LayerConfig& l = config.layers[i];
    if (!owns_kv(l)) continue;
    LayerStorage& s = layers_[i];
    const int64_t blocks = l.kind == AttentionKind::Full ? options.full_blocks : options.sliding_blocks;
    s.keys = static_cast<uint8_t*>(memory_) + offsets[i];
    s.values = static_cast<uint8_t*>(s.keys) + size_t(blocks) * size_t(s.block_stride) * size_t(s.kv_heads) * elem;
  }
  if (options.prefault) prefault_blocks(options.full_blocks, options.sliding_blocks);
  // Hand out low block numbers first: they are the ones most likely already backed by memory.
  for (int64_t b = options.full_blocks - 1; b >= 0; --b) free_full_.push_back(int32_t(b));
  full_holders_.assign(size_t(options.full_blocks), 0);
  for (int64_t b = options.sliding_blocks - 1; b >= 0; --b) free_sliding_.push_back(int32_t(b));
}

KvCache::~KvCache() {
  if (memory_) ::munmap(memory_, bytes_);
}

KvLayerView KvCache::layer_view(int layer) const {
  const LayerStorage& s = layers_[size_t(layer)];
  KvLayerView v;
  v.keys = s.keys;
  v.values = s.values;
  v.dtype = options_.dtype;
  v.block_stride = s.block_stride;
  v.head_stride = s.head_stride;
  v.block_size = options_.block_size;
  v.head_dim = s.head_dim;
  v.kv_heads = s.kv_heads;
  return v;
}

KvSequence KvCache::sequence_view(int layer, const KvSequenceBlocks& seq) const {
  KvSequence v;
  if (config_.layers[size_t(layer)].kind == AttentionKind::Full) {
    v.blocks = seq.full.data();
    v.first_logical_block = 0;
  } else {
    v.blocks = seq.sliding.data();
    v.first_logical_block = seq.sliding_first;
  }
  return v;
}

void KvCache::prefault_blocks(int64_t full, int64_t sliding) {
  const size_t elem = kv_dtype_size(options_.dtype);
  const uintptr_t page = uintptr_t(::sysconf(_SC_PAGESIZE));  // madvise wants page-aligned starts
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerStorage& s = layers_[i];
    if (!s.keys) continue;
    const bool is_full = config_.layers[i].kind == AttentionKind::Full;
    const int64_t blocks = std::min(is_full ? full : sliding, is_full ? options_.full_blocks : options_.sliding_blocks);
    if (blocks <= 0) continue;
    for (void* base : {s.keys, s.values})
      for (int g = 0; g < s.kv_heads; ++g) {  // each head's blocks are side by side (head-major)
        const uintptr_t begin = reinterpret_cast<uintptr_t>(base) + size_t(g) * size_t(s.head_stride) * elem;
        const uintptr_t end = begin + size_t(blocks) * size_t(s.block_stride) * elem;
        const uintptr_t aligned = begin / page * page;
        prefault_fresh_pages(reinterpret_cast<void*>(aligned), (end - aligned + page - 1) / page * page);
      }
  }
}

int64_t KvCache::full_blocks_for(int length) const {
  return (int64_t(length) + options_.block_size - 1) / options_.block_size;
}

int64_t KvCache::first_visible_block(int position) const {
  return std::max(0, position - config_.sliding_window + 1) / options_.block_size;
}

std::pair<int64_t, int64_t> KvCache::blocks_needed(const KvSequenceBlocks& seq, int end) const {
  if (end <= seq.length) return {0, 0};
  const int64_t last_block = (int64_t(end) - 1) / options_.block_size;
  int64_t full = 0, sliding = 0;
  if (options_.full_blocks > 0) full = std::max<int64_t>(0, last_block + 1 - int64_t(seq.full.size()));
  if (options_.sliding_blocks > 0) {
    sliding = new_sliding_blocks(seq, end);
    sliding -= sliding_blocks_to_drop(seq, sliding).second;
  }
  return {full, sliding};
}

int64_t KvCache::new_sliding_blocks(const KvSequenceBlocks& seq, int end) const {
  if (end <= seq.length) return 0;
  const int64_t first = seq.sliding.empty() ? first_visible_block(seq.length) : seq.sliding_first;
  return std::max<int64_t>(0, (int64_t(end) - 1) / options_.block_size + 1 - (first + int64_t(seq.sliding.size())));
}

std::pair<int64_t, int64_t> KvCache::sliding_blocks_to_drop(const KvSequenceBlocks& seq, int64_t new_blocks) const {
  if (seq.sliding.empty()) return {0, 0};
  const int64_t over = int64_t(seq.sliding.size()) + new_blocks - options_.sliding_blocks_per_sequence;
  const int64_t unseen = std::max<int64_t>(0, first_visible_block(seq.length) - seq.sliding_first);
  const int64_t drop = std::clamp<int64_t>(over, 0, unseen);
  int64_t freed = 0;
  for (int64_t i = 0; i < drop; ++i) freed += pins(seq, seq.sliding_first + i) ? 0 : 1;
  return {drop, freed};
}

bool KvCache::pins(const KvSequenceBlocks& seq, int64_t logical_block) const {
  return seq.pinned_length > 0 && logical_block >= first_visible_block(seq.pinned_length - 1) &&
         logical_block <= (int64_t(seq.pinned_length) - 1) / options_.block_size;
}

void KvCache::drop_oldest_sliding(KvSequenceBlocks& seq) {
  const int32_t block = seq.sliding.front();
  if (pins(seq, seq.sliding_first)) {
    if (seq.pinned.empty()) seq.pinned_first = seq.sliding_first;
    seq.pinned.push_back(block);
  } else {
    free_sliding_.push_back(block);
  }
  seq.sliding.erase(seq.sliding.begin());
  ++seq.sliding_first;
}

void KvCache::pin(KvSequenceBlocks& seq, int length) {
  if (options_.pinned_blocks_per_sequence == 0 || options_.sliding_blocks == 0 || length < 1) return;
  free_sliding_.insert(free_sliding_.end(), seq.pinned.begin(), seq.pinned.end());
  seq.pinned.clear();
  seq.pinned_length = length;
}

bool KvCache::reserve(KvSequenceBlocks& seq, int end) {
  const auto [full_needed, sliding_net] = blocks_needed(seq, end);
  if (full_needed > free_full_blocks() || sliding_net > free_sliding_blocks()) return false;
  if (options_.sliding_blocks > 0 && seq.sliding.empty()) seq.sliding_first = first_visible_block(seq.length);
  for (int64_t i = 0; i < full_needed; ++i) seq.full.push_back(take_full());
  const int64_t sliding_needed = options_.sliding_blocks > 0 ? new_sliding_blocks(seq, end) : 0;
  for (int64_t i = sliding_blocks_to_drop(seq, sliding_needed).first; i > 0; --i) drop_oldest_sliding(seq);
  for (int64_t i = 0; i < sliding_needed; ++i) {
    seq.sliding.push_back(free_sliding_.back());
    free_sliding_.pop_back();
  }
  return true;
}

void KvCache::trim_window(KvSequenceBlocks& seq) {
  const int64_t keep_from = first_visible_block(seq.length);  // the next query is at seq.length
  while (!seq.sliding.empty() && seq.sliding_first < keep_from &&
         int64_t(seq.sliding.size()) > options_.sliding_blocks_per_sequence)
    drop_oldest_sliding(seq);
}

int32_t KvCache::take_full() {
  const int32_t block = free_full_.back();
  free_full_.pop_back();
  full_holders_[size_t(block)] = 1;
  return block;
}

void KvCache::let_go_full(int32_t block) {
  if (--full_holders_[size_t(block)] == 0) free_full_.push_back(block);
}

void KvCache::release(KvSequenceBlocks& seq) {
  for (int32_t block : seq.full) let_go_full(block);
  free_sliding_.insert(free_sliding_.end(), seq.sliding.begin(), seq.sliding.end());
  free_sliding_.insert(free_sliding_.end(), seq.pinned.begin(), seq.pinned.end());
  seq = KvSequenceBlocks{};
}

std::optional<KvSequenceBlocks> KvCache::truncated(const KvSequenceBlocks& seq, int length) const {
  if (length < 0 || length > seq.length) return std::nullopt;
  KvSequenceBlocks cut = seq;
  cut.length = length;
  const int64_t blocks = full_blocks_for(length);  // logical blocks [0, blocks) hold [0, length)
  if (int64_t(cut.full.size()) > blocks) cut.full.resize(size_t(blocks));
  cut.pinned.clear();
  cut.pinned_length = 0;
  if (options_.sliding_blocks > 0 && length > 0 && (!seq.sliding.empty() || !seq.pinned.empty())) {
    // The blocks a query at `length` sees, from the sequence's own run or its pinned one.
    const int64_t first = first_visible_block(length);
    cut.sliding.clear();
    cut.sliding_first = first;
    for (int64_t b = first; b < blocks; ++b) {
      if (b >= seq.sliding_first && b < seq.sliding_first + int64_t(seq.sliding.size()))
        cut.sliding.push_back(seq.sliding[size_t(b - seq.sliding_first)]);
      else if (b >= seq.pinned_first && b < seq.pinned_first + int64_t(seq.pinned.size()))
        cut.sliding.push_back(seq.pinned[size_t(b - seq.pinned_first)]);
      else
        return std::nullopt;
    }
  } else if (length == 0) {
    cut.sliding.clear();
  }
  return cut;
}

bool KvCache::truncate(KvSequenceBlocks& seq, int length) {
  std::optional<KvSequenceBlocks> cut = truncated(seq, length);
  if (!cut) fail("cannot cut a sequence of {} positions back to {}: its sliding window has moved on", seq.length, length);
  const bool copy_last = truncate_blocks_needed(seq, length, [&](int32_t b) { return full_block_holders(b); }) > 0;
  // The blocks past the cut go back first, so the copy may take one of them.
  int64_t freed = 0;
  for (size_t b = cut->full.size(); b < seq.full.size(); ++b) freed += full_block_holders(seq.full[b]) == 1;
  if (copy_last && free_full_blocks() + freed == 0) return false;
  for (size_t b = cut->full.size(); b < seq.full.size(); ++b) let_go_full(seq.full[b]);
  if (copy_last) {
    // The sequence writes on from `length` into this block, which others read up to their lengths.
    int32_t& last = cut->full.back();
    const int32_t copy = take_full();
    copy_block(AttentionKind::Full, last, copy);
    let_go_full(last);
    last = copy;
  }
  for (const std::vector<int32_t>* run : {&seq.sliding, &seq.pinned})
    for (int32_t block : *run)
      if (std::find(cut->sliding.begin(), cut->sliding.end(), block) == cut->sliding.end()) free_sliding_.push_back(block);
  seq = std::move(*cut);
  return true;
}

std::optional<std::pair<int64_t, int64_t>> KvCache::copy_blocks_needed(const KvSequenceBlocks& source,
                                                                       int length) const {
  const std::optional<KvSequenceBlocks> cut = truncated(source, length);
  if (!cut) return std::nullopt;
  return std::pair{int64_t(length % options_.block_size != 0 && !cut->full.empty()), int64_t(cut->sliding.size())};
}

bool KvCache::copy_prefix(const KvSequenceBlocks& source, KvSequenceBlocks& target, int length) {
  if (!target.full.empty() || !target.sliding.empty() || !target.pinned.empty() || target.length != 0)
    fail("a KV prefix can only be copied into an empty sequence");
  std::optional<KvSequenceBlocks> cut = truncated(source, length);
  if (!cut) fail("cannot copy {} positions of a sequence of {}: its sliding window has moved on", length, source.length);
  const auto [full_needed, sliding_needed] = *copy_blocks_needed(source, length);
  if (full_needed > free_full_blocks() || sliding_needed > free_sliding_blocks()) return false;
  // A last block that `length` fills in part may hold the source's later positions too; the target
  // writes over them before any query of its own reads them.
  for (size_t b = 0; b < cut->full.size(); ++b) {
    int32_t& block = cut->full[b];
    if (b + 1 < cut->full.size() || full_needed == 0) {
      ++full_holders_[size_t(block)];
      continue;
    }
    const int32_t copy = take_full();
    copy_block(AttentionKind::Full, block, copy);
    block = copy;
  }
  for (int32_t& block : cut->sliding) {
    const int32_t copy = free_sliding_.back();
    free_sliding_.pop_back();
    copy_block(AttentionKind::Sliding, block, copy);
    block = copy;
  }
  target = std::move(*cut);
  return true;
}

void KvCache::copy_block(AttentionKind kind, int32_t from, int32_t to) {
  const size_t elem = kv_dtype_size(options_.dtype);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerStorage& s = layers_[i];
    if (!s.keys || config_.layers[i].kind != kind) continue;
    const size_t bytes = size_t(s.block_stride) * elem;
    for (uint8_t* base : {static_cast<uint8_t*>(s.keys), static_cast<uint8_t*>(s.values)})
      for (int h = 0; h < s.kv_heads; ++h) {
        uint8_t* head = base + size_t(h) * size_t(s.head_stride) * elem;
        std::memcpy(head + size_t(to) * bytes, head + size_t(from) * bytes, bytes);
      }
  }
}

double KvCache::usage() const {
  const int64_t total = options_.full_blocks + options_.sliding_blocks;
  if (total == 0) return 0.0;
  return double(total - free_full_blocks() - free_sliding_blocks()) / double(total);
}

}  // namespace tandem
