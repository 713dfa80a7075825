#pragma once
// The paged KV cache of the fast forward pass. Memory is reserved once at start-up in two pools of
// fixed-size blocks: one for full-attention layers (a sequence holds blocks for its whole context)
// and one for sliding-window layers (a sequence holds only the blocks its window can still see, and
// gives older ones back as it advances). Only layers that compute their own K/V have storage;
// KV-shared layers read their donor's. Each sequence owns a small block table per pool. Sequences
// that start with the same prefix (copy_prefix) share the full-attention blocks it fills: a block
// goes back to the pool when its last holder lets go of it.
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "model/config.h"
#include "model/weights.h"

namespace tandem {

struct KvCacheOptions {
  int block_size = 16;
  KvDType dtype = KvDType::F32;
  int64_t full_blocks = 0;
  int64_t sliding_blocks = 0;
  // The most sliding blocks one sequence holds (its share of the sliding pool: its window and a
  // chunk). A sequence keeps blocks that left its window up to this many, so that prefix reuse can
  // cut it back past its window; 0: it gives them back at once.
  int64_t sliding_blocks_per_sequence = 0;
  // Room per sequence, beyond that share, for the sliding blocks of a pinned window (pin()).
  int64_t pinned_blocks_per_sequence = 0;
  // Back the whole pool with memory at start-up (see prefault_fresh_pages) instead of page by page
  // as blocks are first written: steadier step times, and the memory is committed up front.
  bool prefault = false;
};

struct KvSequenceBlocks {
  std::vector<int32_t> full;        // logical block i -> physical block in the full pool
  std::vector<int32_t> sliding;     // logical block (sliding_first + i) -> physical sliding block
  int64_t sliding_first = 0;
  int length = 0;                   // positions [0, length) are stored
  // KvCache::pin(): sliding blocks of the window a query at pinned_length - 1 or pinned_length sees,
  // kept once they leave the sequence's own window (logical blocks pinned_first + i).
  std::vector<int32_t> pinned;
  int64_t pinned_first = 0;
  int pinned_length = 0;            // 0: nothing pinned
};

// The KV cache element type a model gets unless its user picks one (`--kv-dtype auto`): f32 where
// the streamed weights are float (bf16/f16/f32), so that greedy decode stays token-exact against the
// float32 reference; bf16 where they are quantized (q8/q4), whose outputs already differ from the
// float model by far more than rounding K and V to bf16 moves them (docs/quantization.md). There a
// bf16 cache halves what attention reads per token and what each cached token costs, as llama.cpp
// (f16) and vLLM (the model's bf16) keep theirs.
KvDType default_kv_dtype(const ModelWeights& weights);

class KvCache {
 public:
  KvCache(const Gemma4Config& config, const ModelWeights& weights, const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Bytes one block of each pool takes (all layers of that kind together).
  static size_t full_block_bytes(const Gemma4Config& config, const ModelWeights& weights, const KvCacheOptions& o);
  static size_t sliding_block_bytes(const Gemma4Config& config, const ModelWeights& weights, const KvCacheOptions& o);
  // Sliding blocks one sequence needs at most while prefilling chunks of up to `max_chunk` tokens.
  static int64_t sliding_blocks_per_sequence(const Gemma4Config& config, int block_size, int max_chunk);
  // Sliding blocks a pinned window takes at most (pin()).
  static int64_t pinned_blocks_per_sequence(const Gemma4Config& config, int block_size);
  // Splits a memory budget between the pools so that `max_sequences` sequences fit in the sliding
  // pool, each with room for a pinned window when `pin_windows`.
  static KvCacheOptions plan(const Gemma4Config& config, const ModelWeights& weights, size_t budget_bytes,
                             int max_sequences, int max_chunk, int block_size, KvDType dtype, bool pin_windows = false);

  const KvCacheOptions& options() const { return options_; }
  KvLayerView layer_view(int layer) const;  // the storage of `layer`, which must own its K/V
  KvSequence sequence_view(int layer, const KvSequenceBlocks& seq) const;  // rows/positions left unset

  // Full-pool blocks needed to store positions [0, length).
  int64_t full_blocks_for(int length) const;
  // Blocks (full, sliding) that reserve(seq, end) would take from the pools (for sliding layers, net
  // of the blocks left of the window it gives back to stay within its share).
  std::pair<int64_t, int64_t> blocks_needed(const KvSequenceBlocks& seq, int end) const;
  // Allocates the blocks positions [seq.length, end) need, keeping what sliding layers can still
  // see (and older blocks within the sequence's share). Returns false and changes nothing when a
  // pool is short.
  bool reserve(KvSequenceBlocks& seq, int end);
  // Backs the storage of the `full` and `sliding` lowest-numbered blocks of each pool with memory
  // now (prefault_fresh_pages), before any step has written the cache: a pool hands its lowest
  // blocks out first, so a caller that knows how many it will use keeps page faults out of its
  // steps without committing the rest of the pool.
  void prefault_blocks(int64_t full, int64_t sliding);
  // After a step that stored up to seq.length: returns sliding blocks no later query can see, but
  // those within the sequence's share (KvCacheOptions::sliding_blocks_per_sequence).
  void trim_window(KvSequenceBlocks& seq);
  void release(KvSequenceBlocks& seq);
  // The block table of `seq` cut back to its first `length` positions, for a sequence that goes on
  // from there (prefix reuse); nullopt where a sliding layer has given back a block that a query at
  // `length` still sees. Changes nothing: truncate() does the cut.
  std::optional<KvSequenceBlocks> truncated(const KvSequenceBlocks& seq, int length) const;
  // Cuts `seq` to truncated(seq, length), returning the rest of its blocks to the pools (full ones
  // that other sequences share stay with them). A shared block that `length` fills in part is then
  // replaced by a copy of its own (truncate_blocks_needed); returns false and changes nothing when
  // the pool, with the blocks the cut gives back, has none for it.
  bool truncate(KvSequenceBlocks& seq, int length);
  // Blocks (full, sliding) copy_prefix(source, ..., length) takes from the pools; nullopt where
  // truncated() is.
  std::optional<std::pair<int64_t, int64_t>> copy_blocks_needed(const KvSequenceBlocks& source, int length) const;
  // Gives the empty `target` the first `length` positions of `source` (the blocks truncated(source,
  // length) keeps), which goes on unchanged: a prompt that shares a prefix with another sequence's
  // starts from there. The full-attention blocks that `length` fills are shared, not copied (a block
  // is written only at positions past every holder's length, so a whole block below `length` never
  // changes); a last block it fills only in part, and the sliding blocks, are copied (K and V of
  // every layer). Returns false and changes nothing when a pool is short.
  bool copy_prefix(const KvSequenceBlocks& source, KvSequenceBlocks& target, int length);
  // How many sequences hold full-attention block `block` (0: it is free).
  int32_t full_block_holders(int32_t block) const { return full_holders_[size_t(block)]; }
  // Full blocks truncate(seq, length) takes from the pool: 1 where the block that would hold
  // position `length` is partly filled and shared (the cut copies it before the sequence writes
  // there), else 0. `holders` says how many hold a block (full_block_holders, or a caller's forecast).
  template <typename Holders>
  int64_t truncate_blocks_needed(const KvSequenceBlocks& seq, int length, Holders&& holders) const {
    if (length % options_.block_size == 0 || length > seq.length) return 0;
    const size_t last = size_t(length / options_.block_size);
    return last < seq.full.size() && holders(seq.full[last]) > 1 ? 1 : 0;
  }
  // Keeps the sliding blocks a query at `length - 1` or `length` sees (a prompt's end) when they leave
  // the sequence's window, so that it can be cut back there however far it goes on: the next turn of
  // a chat after a long (thinking) answer, or the same prompt again. Needs pinned_blocks_per_sequence.
  void pin(KvSequenceBlocks& seq, int length);

  int64_t free_full_blocks() const { return int64_t(free_full_.size()); }
  int64_t free_sliding_blocks() const { return int64_t(free_sliding_.size()); }
  int64_t total_blocks() const { return options_.full_blocks + options_.sliding_blocks; }
  double usage() const;  // fraction of all blocks in use
  size_t bytes() const { return bytes_; }

 private:
  struct LayerStorage {
    void* keys = nullptr;
    void* values = nullptr;
    int64_t block_stride = 0;
    int64_t head_stride = 0;
    int head_dim = 0;
    int kv_heads = 0;
  };
  int64_t first_visible_block(int position) const;  // for sliding layers
  void copy_block(AttentionKind kind, int32_t from, int32_t to);  // K and V of every layer of that kind
  // Sliding blocks past those `seq` holds that positions up to `end` need, before any is dropped.
  int64_t new_sliding_blocks(const KvSequenceBlocks& seq, int end) const;
  // Sliding blocks left of the window that reserving `new_blocks` more must drop, and how many of
  // them go back to the pool (the others are pinned).
  std::pair<int64_t, int64_t> sliding_blocks_to_drop(const KvSequenceBlocks& seq, int64_t new_blocks) const;
  bool pins(const KvSequenceBlocks& seq, int64_t logical_block) const;
  void drop_oldest_sliding(KvSequenceBlocks& seq);  // to the pinned run or the pool
  int32_t take_full();                // a free full block, now held once
  void let_go_full(int32_t block);    // one holder fewer; back to the pool with none left

  const Gemma4Config& config_;
  KvCacheOptions options_;
  std::vector<LayerStorage> layers_;  // by layer index; empty for KV-shared layers
  std::vector<int32_t> free_full_, free_sliding_;
  std::vector<int32_t> full_holders_;  // by full block: the sequences that hold it
  void* memory_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace tandem
