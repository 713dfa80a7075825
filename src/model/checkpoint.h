#pragma once
// A Gemma 4 checkpoint opened for inference: the mapped files, the parsed configs and this rank's
// bound weights. Held by pointer because the weights point into the file mappings.
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "core/thread_pool.h"
#include "model/config.h"
#include "model/resident_weights.h"
#include "model/shard_plan.h"
#include "model/weights.h"

namespace tandem {

// Mapped: weights are used in place from the file mappings (zero-copy; fast to open).
// Resident: the matrices decoding streams are copied into huge-page memory (see resident_weights.h).
enum class WeightResidency { Mapped, Resident };

struct Gemma4Checkpoint {
  std::string dir;
  Gemma4Config config;
  GenerationConfig generation;
  CheckpointFiles files;
  ModelWeights weights;
  ShardPlan plan;
  std::unique_ptr<ResidentWeights> resident;  // set when opened Resident

  static std::unique_ptr<Gemma4Checkpoint> open(const std::string& dir, const ShardPlan& plan = {});
  // Opens, then makes the streamed weights resident with `pool`'s threads, in the layouts
  // choose_layout asks for (see ResidentWeights::load).
  static std::unique_ptr<Gemma4Checkpoint> open(const std::string& dir, const ShardPlan& plan,
                                                WeightResidency residency, ThreadPool& pool, bool show_progress,
                                                ResidentWeights::LayoutChooser choose_layout = nullptr);

  // The PLE table stays in its file mapping and is gathered one row per token, so with a cold page
  // cache each new token's row is a disk read (~6 ms measured here; 3 s over a 512-token prompt).
  // Reads the table into the page cache (nothing mapped, RSS unchanged) when it fits in half the
  // available memory; returns whether it did. Seconds for E4B's 5.6 GB: call it off the hot path
  // (`stop` ends it early).
  bool warm_ple_table(std::stop_token stop = {}) const;

 private:
  Gemma4Checkpoint(const std::string& dir, const ShardPlan& plan);
};

}  // namespace tandem
