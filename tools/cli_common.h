#pragma once
// Helpers shared by the `tandem` subcommands: option parsing of id lists, the demo model, JSON output.
#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/ops.h"
#include "model/checkpoint.h"
#include "model/sequence_model.h"
#include "parallel/communicator.h"

namespace tandem::cli {

std::vector<int32_t> parse_id_list(const std::string& text);  // "2,17,5" -> {2, 17, 5}; Error if malformed

// The model folder to use: `model` when given, else the demo model, synthesized on first use
// (random weights) in $TANDEM_DEMO_MODEL or ~/.cache/tandem/demo-model.
std::string resolve_model_dir(const std::string& model);

// For --model: an empty value (`--model "$UNSET_VAR"`) is an error, not the demo model.
extern const CLI::Validator kNonEmptyPath;

// A finite number >= 0 (CLI11's range checks let NaN through).
extern const CLI::Validator kFiniteNonNegative;

// DIR/tokenizer.json; Error naming the file if the model folder has none.
std::string tokenizer_path(const std::string& model_dir);

// Appends a float so that it parses back to the same value.
void append_float(std::string& out, float value);

// The communicator of this process: MPI ranks under mpirun, else a single local rank.
Communicator& world();
void set_world(std::unique_ptr<Communicator> comm);
// Default thread count: this machine's cores shared among the ranks running on it.
int default_threads();

// A checkpoint with one sequence model over it: the fast CPU path, or the float32 reference.
struct LoadedModel {
  std::unique_ptr<Gemma4Checkpoint> checkpoint;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<Ops> ops;
  std::unique_ptr<SequenceModel> model;
};
struct ModelOptions {
  std::string model_dir;
  std::string backend = "cpu";  // cpu | reference
  int threads = 0;
  std::string kv_dtype = "auto";  // auto | f32 | bf16
  std::string weights = "resident";  // resident | mapped
  std::string weight_layout = "auto";  // auto | plain | interleaved
};
WeightResidency weight_residency(const std::string& option);
void add_model_options(CLI::App& cmd, ModelOptions& options);

// --weight-layout: how resident Q8/Q4 weights are arranged (kernels/weight.h, WeightLayout).
void add_weight_layout_option(CLI::App& cmd, std::string& option);
// The loader's layout choice for --weight-layout `option`. auto: interleaved where the CPU's kernels
// have it (batches multiply it up to 1.8x faster, and one sequence decodes faster from its row
// groups; docs/kernels.md). Error for interleaved with mapped weights.
ResidentWeights::LayoutChooser layout_chooser(const std::string& option, const std::string& residency);
// "interleaved" when any of the loaded projections is in that layout (matrices whose columns are not
// whole 512-column chunks always stay plain), else "plain".
std::string loaded_weight_layout(const ModelWeights& weights);
// --kv-dtype: auto (the default) takes default_kv_dtype (model/kv_cache.h): f32 for float weights,
// bf16 for q8/q4 ones.
void add_kv_dtype_option(CLI::App& cmd, std::string& option);
KvDType kv_dtype_option(const std::string& option, const ModelWeights& weights);
LoadedModel load_model(const ModelOptions& options, int64_t max_context);

}  // namespace tandem::cli
