#pragma once
// One sequence at a time, for the CLI and for tests: feed tokens, get logits. Implemented by the
// float32 reference and by the fast forward pass, so both can be driven (and compared) the same way.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/ops.h"
#include "model/checkpoint.h"
#include "model/gemma4.h"
#include "model/kv_cache.h"
#include "parallel/communicator.h"

namespace tandem {

class SequenceModel {
 public:
  virtual ~SequenceModel() = default;
  // Runs `tokens` at the next positions; returns full-vocabulary logits for every token, or only
  // the last one. With tensor parallelism this is a collective call, and every rank gets the rows.
  virtual std::vector<std::vector<float>> forward(std::span<const int32_t> tokens, bool all_positions) = 0;
  virtual void reset() = 0;
  virtual int position() const = 0;
};

// The fast path for a single sequence: a KV cache sized for `max_context`, prompts run in chunks.
class FastSequenceModel final : public SequenceModel {
 public:
  FastSequenceModel(const Gemma4Checkpoint& checkpoint, Ops& ops, Communicator& comm, int max_context,
                    int chunk_tokens = 256, KvDType kv_dtype = KvDType::F32);
  std::vector<std::vector<float>> forward(std::span<const int32_t> tokens, bool all_positions) override;
  void reset() override;
  int position() const override { return blocks_.length; }
  Gemma4Model& model() { return *model_; }

 private:
  int chunk_tokens_;
  int max_context_;
  Communicator& comm_;
  std::vector<float> gathered_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Gemma4Model> model_;
  KvSequenceBlocks blocks_;
};

}  // namespace tandem
