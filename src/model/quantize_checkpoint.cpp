#include "model/quantize_checkpoint.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "model/weights.h"
#include "core/progress.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "kernels/quantize.h"
#include "model/config.h"

namespace tandem {

namespace {

namespace fs = std::filesystem;

constexpr const char* kSideFiles[] = {"config.json",         "generation_config.json",  "tokenizer.json",
                                      "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                                      "chat_template.json"};
constexpr size_t kChunkBytes = 64 << 20;  // input bytes of one chunk of rows

enum class Action { Quantize, Copy, Drop };

// What happens to each tensor: the text model's 2-D linear weights are quantized; the other text
// tensors (norms, layer_scalar, the PLE table embed_tokens_per_layer, whose rows are gathered and
// never multiplied) are copied; vision/audio towers and KV-shared layers' k/v, which the loader
// never reads, are dropped.
class Plan {
 public:
  Plan(const CheckpointFiles& files, const Gemma4Config& config) : prefix_(text_weight_prefix(files)) {
    for (const LayerConfig& lc : config.layers)
      if (lc.shares_kv) shared_kv_layers_.insert(int(&lc - config.layers.data()));
  }

  Action action(const TensorInfo& t) const {
    if (t.name.compare(0, prefix_.size(), prefix_) != 0) return Action::Drop;
    const std::string name = t.name.substr(prefix_.size());
    static const std::regex layer_matrix(
        R"(layers\.(\d+)\.(self_attn\.(q|k|v|o)_proj|mlp\.(gate|up|down)_proj|per_layer_input_gate|per_layer_projection)\.weight)");
    std::smatch m;
    bool linear = name == "embed_tokens.weight" || name == "per_layer_model_projection.weight";
    if (std::regex_match(name, m, layer_matrix)) {
      const std::string kind = m[3].str();
      if ((kind == "k" || kind == "v") && shared_kv_layers_.count(std::stoi(m[1].str()))) return Action::Drop;
      linear = true;
    }
    if (!linear) return Action::Copy;
    if (t.dtype == DType::I8 || t.dtype == DType::U8)
      fail("{}: tensor '{}' is already quantized ({}); quantize the original checkpoint", t.file, t.name,
           dtype_name(t.dtype));
    if (t.shape.size() != 2) fail("{}: tensor '{}' has shape {}, expected a matrix", t.file, t.name, t.shape_string());
    if (t.dtype != DType::BF16 && t.dtype != DType::F16 && t.dtype != DType::F32)
      fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", t.file, t.name, dtype_name(t.dtype));
    // The loader requires whole blocks; a matrix without them stays exact (never the case in Gemma 4).
    return t.shape[1] % kQuantBlock == 0 ? Action::Quantize : Action::Copy;
  }

 private:
  std::string prefix_;
  std::set<int> shared_kv_layers_;
};

// One loop per dtype, so the bf16 one (every Gemma 4 checkpoint) compiles to plain shifts.
void widen_row(const TensorInfo& t, int64_t row, float* out) {
  const int64_t cols = t.shape[1];
  const uint8_t* p = t.data + size_t(row * cols) * dtype_size(t.dtype);
  uint16_t h;
  switch (t.dtype) {
    case DType::F32: std::memcpy(out, p, size_t(cols) * 4); break;
    case DType::F16:
      for (int64_t c = 0; c < cols; ++c) std::memcpy(&h, p + 2 * c, 2), out[c] = f16_to_f32(h);
      break;
    default:
      for (int64_t c = 0; c < cols; ++c) std::memcpy(&h, p + 2 * c, 2), out[c] = bf16_to_f32(h);
      break;
  }
}

// Writes NAME (the codes, chunk by chunk) and then NAME_scale (kept in memory: 1/16 of the codes).
void write_quantized(const TensorInfo& t, WeightFormat type, ThreadPool& pool, SafetensorsWriter& writer,
                     Progress& progress) {
  const int64_t rows = t.shape[0], cols = t.shape[1];
  const int64_t code_bytes = row_bytes(type, cols), blocks = cols / kQuantBlock;
  const int64_t in_row_bytes = cols * int64_t(dtype_size(t.dtype));
  const int64_t chunk_rows = std::max<int64_t>(1, int64_t(kChunkBytes) / in_row_bytes);
  std::vector<uint8_t> codes(size_t(std::min(rows, chunk_rows) * code_bytes));
  std::vector<uint16_t> scales(size_t(rows * blocks));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t count = std::min(chunk_rows, rows - r0);
    pool.parallel_for(count, [&](int64_t b, int64_t e) {
      thread_local std::vector<float> row;
      row.resize(size_t(cols));
      for (int64_t i = b; i < e; ++i) {
        widen_row(t, r0 + i, row.data());
        uint8_t* q = codes.data() + i * code_bytes;
        uint16_t* s = scales.data() + (r0 + i) * blocks;
        try {
          if (type == WeightFormat::Q8)
            quantize_row_q8(row.data(), cols, reinterpret_cast<int8_t*>(q), s);
          else
            quantize_row_q4(row.data(), cols, q, s);
        } catch (const Error& e) {
          fail("{}: tensor '{}' row {}: {}", t.file, t.name, r0 + i, e.what());
        }
      }
    });
    writer.write(codes.data(), size_t(count * code_bytes));
    progress.advance(uint64_t(count * in_row_bytes));
  }
  writer.write(scales.data(), scales.size() * 2);
}

void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) fail("{}: cannot write", path);
}

// Files are written into a hidden folder inside the output folder and renamed into place only once
// all of them are complete, so a failed run (a bad tensor, a full disk, Ctrl-C) leaves the folder as
// it was, and nothing is ever written through what the folder held before: a shard there that is a
// link to an input file, or that a server has mapped, keeps its bytes (it is replaced, not rewritten).
class StagedOutput {
 public:
  explicit StagedOutput(const std::string& out_dir)
      : out_dir_(out_dir), dir_(out_dir + "/.tandem-quantize-" + std::to_string(::getpid())) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::create_directories(dir_, ec);
    if (ec) fail("{}: cannot create folder: {}", dir_, ec.message());
  }
  ~StagedOutput() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  // Where the file `name` is written until commit().
  std::string path(const std::string& name) {
    names_.push_back(name);
    return dir_ + "/" + name;
  }
  void commit() {
    for (const std::string& name : names_) {
      std::error_code ec;
      fs::rename(dir_ + "/" + name, out_dir_ + "/" + name, ec);
      if (ec) fail("{}: cannot move into place: {}", out_dir_ + "/" + name, ec.message());
    }
  }

 private:
  std::string out_dir_, dir_;
  std::vector<std::string> names_;
};

}  // namespace

QuantizeSummary quantize_checkpoint(const std::string& in_dir, const std::string& out_dir, WeightFormat type,
                                    bool show_progress) {
  if (type != WeightFormat::Q8 && type != WeightFormat::Q4)
    fail("cannot quantize to {}: only q8 and q4", weight_format_name(type));
  std::error_code ec;
  if (fs::exists(out_dir) && fs::equivalent(in_dir, out_dir, ec))
    fail("{}: the output folder must differ from the input folder", out_dir);
  const CheckpointFiles files(in_dir);
  const Gemma4Config config = Gemma4Config::load(in_dir);
  const Plan plan(files, config);
  // Binding checks every tensor's shape against config.json, finite norms and what has no place in
  // the model, so a checkpoint the loader would refuse is refused here, before anything is written.
  ModelWeights::bind(files, config, ShardPlan{0, 1});
  fs::create_directories(out_dir, ec);
  if (ec) fail("{}: cannot create folder: {}", out_dir, ec.message());
  StagedOutput staged(out_dir);

  const std::string quant_name(weight_format_name(type));
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"tandem_quantization", quant_name}};
  QuantizeSummary summary;
  uint64_t total_in = 0;
  for (const auto& file : files.files())
    for (const TensorInfo& t : file->tensors())
      if (plan.action(t) != Action::Drop) total_in += t.nbytes;

  ThreadPool pool(0);
  Progress progress("quantize " + quant_name, show_progress ? total_in : 0);
  std::map<std::string, std::string> weight_map;
  // One output shard per input shard, with the same name, so the folder keeps its published shape.
  for (const auto& file : files.files()) {
    const std::string shard = fs::path(file->path()).filename().string();
    std::vector<TensorSpec> specs;
    std::vector<std::pair<const TensorInfo*, Action>> order;
    for (const TensorInfo& t : file->tensors()) {
      const Action a = plan.action(t);
      if (a == Action::Drop) {
        ++summary.dropped;
        continue;
      }
      order.emplace_back(&t, a);
      if (a == Action::Copy) {
        specs.push_back({t.name, t.dtype, t.shape});
        continue;
      }
      const int64_t rows = t.shape[0], cols = t.shape[1];
      specs.push_back({t.name, type == WeightFormat::Q8 ? DType::I8 : DType::U8, {rows, row_bytes(type, cols)}});
      specs.push_back({t.name + "_scale", DType::F16, {rows, cols / kQuantBlock}});
    }
    if (order.empty()) continue;
    SafetensorsWriter writer(staged.path(shard), specs, metadata);
    for (const auto& [t, a] : order) {
      summary.bytes_in += t->nbytes;
      weight_map[t->name] = shard;
      if (a == Action::Copy) {
        writer.write(t->data, t->nbytes);
        progress.advance(t->nbytes);
        ++summary.copied;
      } else {
        write_quantized(*t, type, pool, writer, progress);
        weight_map[t->name + "_scale"] = shard;
        ++summary.quantized;
      }
    }
    summary.bytes_out += writer.data_bytes();
    writer.finish();
  }
  progress.finish();

  if (files.files().size() > 1 || file_exists(in_dir + "/model.safetensors.index.json")) {
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    for (const auto& [name, shard] : weight_map) map[name] = shard;
    write_json(staged.path("model.safetensors.index.json"),
               {{"metadata", {{"total_size", summary.bytes_out}, {"tandem_quantization", quant_name}}},
                {"weight_map", map}});
  }
  for (const char* name : kSideFiles) {
    const std::string from = in_dir + "/" + name;
    if (!file_exists(from)) continue;
    fs::copy_file(from, staged.path(name), fs::copy_options::overwrite_existing, ec);
    if (ec) fail("{}: cannot copy into {}: {}", from, out_dir, ec.message());
  }
  staged.commit();
  return summary;
}

}  // namespace tandem
