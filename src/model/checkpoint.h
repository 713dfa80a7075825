#pragma once
// A Gemma 4 checkpoint opened for inference: the mapped files, the parsed configs and this rank's
// bound weights. Held by pointer because the weights point into the file mappings.
#include <memory>
#include <string>

#include "io/checkpoint.h"
#include "model/config.h"
#include "model/shard_plan.h"
#include "model/weights.h"

namespace tandem {

struct Gemma4Checkpoint {
  std::string dir;
  Gemma4Config config;
  GenerationConfig generation;
  CheckpointFiles files;
  ModelWeights weights;
  ShardPlan plan;

  static std::unique_ptr<Gemma4Checkpoint> open(const std::string& dir, const ShardPlan& plan = {});

 private:
  Gemma4Checkpoint(const std::string& dir, const ShardPlan& plan);
};

}  // namespace tandem
