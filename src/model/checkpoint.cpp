#include "model/checkpoint.h"

#include "core/mapped_file.h"

namespace tandem {

Gemma4Checkpoint::Gemma4Checkpoint(const std::string& d, const ShardPlan& p)
    : dir(d),
      config(Gemma4Config::load(d)),
      generation(GenerationConfig::load(d, config)),
      files(d),
      weights(ModelWeights::bind(files, config, p)),
      plan(p) {
  // The PLE table is gathered a row (tens of KB) at a time: a 2 MB page-cache folio mapped whole
  // per row would count 2 MB of RSS for each token ever seen.
  if (const MappedFile* m = files.mapping_of(weights.ple_table.data))
    m->advise_no_huge_pages(size_t(weights.ple_table.data - m->data()),
                            size_t(weights.ple_table.rows) * size_t(weights.ple_table.row_stride));
}

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

bool Gemma4Checkpoint::warm_ple_table(std::stop_token stop) const {
  const WeightMatrix& table = weights.ple_table;
  if (table.empty()) return false;
  const size_t bytes = size_t(table.rows) * size_t(table.row_stride);
  const MappedFile* m = files.mapping_of(table.data);
  if (m == nullptr || bytes * 2 > available_memory_bytes()) return false;
  return m->read_into_page_cache(size_t(table.data - m->data()), bytes, stop);
}

}  // namespace tandem
