#include "model/checkpoint.h"

namespace tandem {

Gemma4Checkpoint::Gemma4Checkpoint(const std::string& d, const ShardPlan& p)
    : dir(d),
      config(Gemma4Config::load(d)),
      generation(GenerationConfig::load(d, config)),
      files(d),
      weights(ModelWeights::bind(files, config, p)),
      plan(p) {}

std::unique_ptr<Gemma4Checkpoint> Gemma4Checkpoint::open(const std::string& dir, const ShardPlan& plan) {
  return std::unique_ptr<Gemma4Checkpoint>(new Gemma4Checkpoint(dir, plan));
}

std::unique_ptr<Gemma4Checkpoint> Gemma4Checkpoint::open(const std::string& dir, const ShardPlan& plan,
                                                         WeightResidency residency, ThreadPool& pool,
                                                         bool show_progress,
                                                         ResidentWeights::LayoutChooser choose_layout) {
  auto checkpoint = open(dir, plan);
  if (residency == WeightResidency::Resident)
    checkpoint->resident = ResidentWeights::load(checkpoint->weights, checkpoint->files, pool, show_progress,
                                                  choose_layout);
  return checkpoint;
}

}  // namespace tandem
