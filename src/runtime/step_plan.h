#pragma once
// One engine step as every tensor-parallel rank must execute it: the ordered KV-block operations
// (release a slot's blocks, reserve blocks up to a length, cut a slot back to a reused prefix, pin
// a prompt's window, copy another slot's prefix) and the tokens each slot runs. Rank 0's
// scheduler builds it; other ranks replay it exactly, so their block tables stay identical without
// ever shipping them. It serializes to a flat byte buffer for the broadcast.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem {

struct KvOp {
  enum Kind : int32_t { Release = 0, Reserve = 1, Truncate = 2, Pin = 3, Copy = 4 };
  Kind kind;
  int32_t slot;
  // Reserve: positions [0, end) must have blocks; Truncate: only [0, end) are kept; Pin: the window
  // at the prompt's end `end` is kept (KvCache::pin); Copy: the empty `slot` starts with positions
  // [0, end) of slot `source`, sharing the blocks they fill (KvCache::copy_prefix)
  int32_t end;
  int32_t source = -1;
};

struct PlannedSequence {
  int32_t slot;
  int32_t first_token;  // index into StepPlan::tokens
  int32_t token_count;
  int32_t logit_rows;
};

struct StepPlan {
  enum Command : int32_t { Run = 0, Shutdown = 1 };
  Command command = Run;
  // With tensor parallelism: how many top logits per row each rank contributes to sampling.
  int32_t candidates = 0;
  int32_t need_log_normalizers = 0;  // some request of this step wants logprobs
  std::vector<KvOp> kv_ops;
  std::vector<PlannedSequence> sequences;
  std::vector<int32_t> tokens;

  void clear();
  std::vector<uint8_t> serialize() const;
  static StepPlan deserialize(const uint8_t* data, size_t size);
};

}  // namespace tandem
