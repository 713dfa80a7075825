#include "cli_common.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "io/checkpoint.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernels.h"
#include "model/reference.h"
#include "model/synth.h"
#include "parallel/mpi_communicator.h"

namespace tandem::cli {

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.front()))) item.erase(item.begin());
    while (!item.empty() && std::isspace(static_cast<unsigned char>(item.back()))) item.pop_back();
    int64_t value = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 0 || value > INT32_MAX)
      fail("--ids: '{}' is not a token id (expected comma-separated non-negative integers)", item);
    ids.push_back(int32_t(value));
    pos = comma + 1;
  }
  if (ids.empty()) fail("--ids: no token ids given");
  return ids;
}

const CLI::Validator kNonEmptyPath(
    [](const std::string& value) { return value.empty() ? std::string("an empty path (leave the option out for the demo model)") : std::string(); },
    "PATH");

const CLI::Validator kFiniteNonNegative(
    [](const std::string& value) {
      char* end = nullptr;
      const double number = std::strtod(value.c_str(), &end);
      const bool ok = end && *end == '\0' && !value.empty() && std::isfinite(number) && number >= 0;
      return ok ? std::string() : "'" + value + "' is not a finite number >= 0";
    },
    "NUMBER>=0");

std::string resolve_model_dir(const std::string& model) {
  if (!model.empty()) return model;
  namespace fs = std::filesystem;
  std::string dir;
  if (const char* env = std::getenv("TANDEM_DEMO_MODEL")) {
    dir = env;
  } else {
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    dir = cache ? std::string(cache) + "/tandem/demo-model"
                : std::string(home ? home : ".") + "/.cache/tandem/demo-model";
  }
  if (file_exists(dir + "/config.json")) return dir;
  std::fprintf(stderr, "tandem: no --model given; creating the demo model (random weights) in %s\n", dir.c_str());
  const std::string partial = dir + ".partial";
  fs::remove_all(partial);
  SynthOptions options;
  options.preset = "demo";
  options.out_dir = partial;
  options.seed = 2026;
  if (const char* tok = std::getenv("TANDEM_DEMO_TOKENIZER")) options.tokenizer_json = tok;
  synthesize_checkpoint(options);
  fs::rename(partial, dir);
  return dir;
}

std::string tokenizer_path(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  if (!file_exists(path)) fail("{}: the model folder has no tokenizer.json (needed for text prompts)", model_dir);
  return path;
}

void append_float(std::string& out, float value) {
  if (!std::isfinite(value)) fail("the model produced a non-finite value ({}); refusing to print it", value);
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, end);
}

namespace {
std::unique_ptr<Communicator> g_world;
}  // namespace

Communicator& world() {
  if (!g_world) g_world = std::make_unique<LocalCommunicator>();
  return *g_world;
}

void set_world(std::unique_ptr<Communicator> comm) { g_world = std::move(comm); }

int default_threads() { return std::max(1, ThreadPool::default_threads() / local_rank_count()); }

void add_model_options(CLI::App& cmd, ModelOptions& o) {
  cmd.add_option("--model", o.model_dir, "Model folder (Hugging Face layout); default: the demo model")
      ->check(kNonEmptyPath);
  cmd.add_option("--backend", o.backend, "cpu (fast path) or reference (float32 reference)")
      ->check(CLI::IsMember({"cpu", "reference"}));
  cmd.add_option("--threads", o.threads, "Threads (default: the CPUs this process may use: its affinity mask, capped by a cgroup CPU quota)")
      ->check(CLI::NonNegativeNumber);
  add_kv_dtype_option(cmd, o.kv_dtype);
  cmd.add_option("--weights", o.weights,
                 "resident: copy the streamed weights into huge-page memory (fastest decode); mapped: use them "
                 "in place from the file mappings (zero-copy, fastest start)")
      ->check(CLI::IsMember({"resident", "mapped"}))
      ->capture_default_str();
  add_weight_layout_option(cmd, o.weight_layout);
}

void add_weight_layout_option(CLI::App& cmd, std::string& option) {
  cmd.add_option("--weight-layout", option,
                 "Resident weights in memory: plain (the checkpoint's order), or interleaved (row groups where this "
                 "CPU's kernels read them: BF16 with AVX-512, Q8 and Q4 with AVX2 or AVX-512; fastest for "
                 "one sequence and for batches); auto is interleaved")
      ->check(CLI::IsMember({"auto", "plain", "interleaved"}))
      ->capture_default_str();
}

ResidentWeights::LayoutChooser layout_chooser(const std::string& option, const std::string& residency) {
  if (option == "interleaved" && residency == "mapped")
    fail("--weight-layout interleaved needs --weights resident: mapped weights are used in the checkpoint's "
         "plain layout, in place");
  if (option == "plain") return nullptr;
  return cpu::preferred_layout;
}

std::string loaded_weight_layout(const ModelWeights& weights) {
  if (weights.lm_head.layout == WeightLayout::Interleaved) return "interleaved";
  for (const LayerWeights& l : weights.layers)
    for (const WeightMatrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj})
      if (m->layout == WeightLayout::Interleaved) return "interleaved";
  return "plain";
}

void add_kv_dtype_option(CLI::App& cmd, std::string& option) {
  cmd.add_option("--kv-dtype", option,
                 "KV cache element type: f32, bf16, or auto (f32 for bf16/f16/f32 weights, which then decode "
                 "token-exact against the float32 reference; bf16 for q8/q4 weights: half the cache's memory and "
                 "reads)")
      ->check(CLI::IsMember({"auto", "f32", "bf16"}))
      ->capture_default_str();
}

KvDType kv_dtype_option(const std::string& option, const ModelWeights& weights) {
  if (option == "f32") return KvDType::F32;
  if (option == "bf16") return KvDType::BF16;
  return default_kv_dtype(weights);
}

WeightResidency weight_residency(const std::string& option) {
  return option == "mapped" ? WeightResidency::Mapped : WeightResidency::Resident;
}

LoadedModel load_model(const ModelOptions& o, int64_t max_context) {
  LoadedModel m;
  Communicator& comm = world();
  if (o.backend == "reference" && comm.size() > 1) fail("the reference backend runs on a single rank");
  // Rank 0 may synthesize the demo model; the others wait for it.
  std::string dir = comm.rank() == 0 ? resolve_model_dir(o.model_dir) : std::string();
  comm.barrier();
  if (comm.rank() != 0) dir = resolve_model_dir(o.model_dir);
  // Before the weights load: positions the model has no rotary frequencies and no KV room for.
  const int context = Gemma4Config::load(dir).max_position_embeddings;
  if (max_context > context)
    fail("{} positions (the prompt and the tokens to generate) exceed the model's context of {}", max_context, context);
  m.pool = std::make_unique<ThreadPool>(o.threads > 0 ? o.threads : default_threads());
  // The reference reads weights row by row, so copying them first would only cost time.
  const WeightResidency residency = o.backend == "reference" ? WeightResidency::Mapped : weight_residency(o.weights);
  m.checkpoint = Gemma4Checkpoint::open(dir, ShardPlan{comm.rank(), comm.size()}, residency, *m.pool, comm.rank() == 0,
                                          layout_chooser(o.weight_layout, o.weights));
  if (o.backend == "reference") {
    m.model = std::make_unique<ReferenceModel>(m.checkpoint->config, m.checkpoint->weights, m.pool.get());
  } else {
    m.ops = std::make_unique<cpu::CpuOps>(*m.pool);
    m.model = std::make_unique<FastSequenceModel>(*m.checkpoint, *m.ops, comm, int(std::max<int64_t>(1, max_context)), 256,
                                                  kv_dtype_option(o.kv_dtype, m.checkpoint->weights));
  }
  return m;
}

}  // namespace tandem::cli
