// tandem quantize: the quantized tiny checkpoint loads through Gemma4Checkpoint::open with the right
// formats, its rows decode close to the original bf16 ones, and malformed pairs give clear errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/checkpoint.h"
#include "model/checkpoint.h"
#include "model/quantize_checkpoint.h"
#include "support/test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

std::vector<const WeightMatrix*> layer_matrices(const LayerWeights& l) {
  return {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj, &l.ple_gate};
}

// Max |quantized - original| over a matrix, relative to the largest |value| of each row's block.
double worst_block_error(const WeightMatrix& q, const WeightMatrix& original) {
  std::vector<float> a(size_t(q.cols)), b(size_t(q.cols));
  double worst = 0;
  for (int64_t r = 0; r < q.rows; ++r) {
    q.row_to_float(r, a.data());
    original.row_to_float(r, b.data());
    for (int64_t blk = 0; blk < q.cols; blk += kQuantBlock) {
      double amax = 0, err = 0;
      for (int64_t c = blk; c < blk + kQuantBlock; ++c) {
        amax = std::max(amax, std::fabs(double(b[size_t(c)])));
        err = std::max(err, std::fabs(double(a[size_t(c)]) - double(b[size_t(c)])));
      }
      if (amax > 0) worst = std::max(worst, err / amax);
    }
  }
  return worst;
}

void check_quantized(WeightFormat type, double max_relative_error) {
  const std::string original_dir = test::synth_checkpoint("tiny");
  test::TempDir out;
  const QuantizeSummary summary = quantize_checkpoint(original_dir, out.path(), type, false);
  EXPECT_GT(summary.quantized, 0);
  EXPECT_GT(summary.dropped, 0);  // vision/audio stand-ins and the shared layers' k/v
  EXPECT_LT(summary.bytes_out, summary.bytes_in);

  auto original = Gemma4Checkpoint::open(original_dir);
  auto quantized = Gemma4Checkpoint::open(out.path());
  EXPECT_EQ(quantized->files.metadata().at("tandem_quantization"), std::string(weight_format_name(type)));
  const ModelWeights& q = quantized->weights;
  const ModelWeights& o = original->weights;
  EXPECT_EQ(q.embed.format, type);
  EXPECT_EQ(q.lm_head.format, type);
  EXPECT_EQ(q.ple_model_projection.format, type);
  EXPECT_EQ(q.ple_table.format, WeightFormat::BF16);  // gathered by token, never multiplied
  EXPECT_LT(worst_block_error(q.embed, o.embed), max_relative_error);
  EXPECT_LT(worst_block_error(q.ple_model_projection, o.ple_model_projection), max_relative_error);
  for (size_t i = 0; i < q.layers.size(); ++i) {
    const auto qm = layer_matrices(q.layers[i]), om = layer_matrices(o.layers[i]);
    for (size_t m = 0; m < qm.size(); ++m) {
      if (qm[m]->empty()) continue;  // k/v of KV-shared layers
      EXPECT_EQ(qm[m]->format, type) << "layer " << i << " matrix " << m;
      EXPECT_LT(worst_block_error(*qm[m], *om[m]), max_relative_error) << "layer " << i << " matrix " << m;
    }
    // per_layer_projection is [H, P] with P = 16 columns in the tiny preset: no whole block, kept exact
    EXPECT_EQ(q.layers[i].ple_projection.format, WeightFormat::BF16);
    EXPECT_EQ(q.layers[i].input_norm, o.layers[i].input_norm);
    EXPECT_EQ(q.layers[i].layer_scalar, o.layers[i].layer_scalar);
  }
  // dropped: nothing outside the text model, no k/v on KV-shared layers
  for (const TensorInfo* t : quantized->files.tensors()) {
    EXPECT_EQ(t->name.rfind("model.language_model.", 0), 0u) << t->name;
  }
  const int first_shared = quantized->config.first_kv_shared_layer();
  EXPECT_EQ(quantized->files.find("model.language_model.layers." + std::to_string(first_shared) +
                                  ".self_attn.k_proj.weight"),
            nullptr);
  EXPECT_TRUE(fs::exists(out.file("config.json")));
  EXPECT_TRUE(fs::exists(out.file("generation_config.json")));
}

TEST(QuantizeCheckpoint, Q8LoadsAndStaysClose) { check_quantized(WeightFormat::Q8, 0.5 / 127 * 1.01); }

TEST(QuantizeCheckpoint, Q4LoadsAndStaysClose) { check_quantized(WeightFormat::Q4, 1.0 / 8 * 1.01); }

// Rewrites the shard holding `name` without it (or with a wrong shape), keeping the index in step.
void tamper(const std::string& dir, const std::string& name, bool drop) {
  const CheckpointFiles files(dir);
  const TensorInfo& victim = files.get(name);
  const std::string path = victim.file;
  std::vector<TensorSpec> specs;
  std::vector<std::vector<uint8_t>> data;
  for (const auto& f : files.files()) {
    if (f->path() != path) continue;
    for (const TensorInfo& t : f->tensors()) {
      if (t.name == name && drop) continue;
      std::vector<int64_t> shape = t.shape;
      if (t.name == name) shape = {shape[0] * shape[1] / 2, 2};  // same bytes, wrong shape
      specs.push_back({t.name, t.dtype, shape});
      data.emplace_back(t.data, t.data + t.nbytes);
    }
  }
  const std::string tmp = path + ".tmp";
  {
    SafetensorsWriter writer(tmp, specs, files.metadata());
    for (const auto& d : data) writer.write(d.data(), d.size());
    writer.finish();
  }
  fs::rename(tmp, path);
  if (drop && fs::exists(dir + "/model.safetensors.index.json")) {
    nlohmann::json index = read_json_file(dir + "/model.safetensors.index.json");
    index["weight_map"].erase(name);
    test::write_file(dir + "/model.safetensors.index.json", index.dump());
  }
}

TEST(QuantizeCheckpoint, MalformedPairsGiveClearErrors) {
  const std::string original_dir = test::synth_checkpoint("tiny");
  const std::string scale = "model.language_model.layers.0.mlp.up_proj.weight_scale";
  for (bool drop : {true, false}) {
    test::TempDir out;
    quantize_checkpoint(original_dir, out.path(), WeightFormat::Q8, false);
    tamper(out.path(), scale, drop);
    try {
      Gemma4Checkpoint::open(out.path());
      ADD_FAILURE() << "a checkpoint with a " << (drop ? "missing" : "misshapen") << " scale opened";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(scale), std::string::npos) << e.what();
    }
  }
}

// Every file of a folder (not descending), name -> bytes.
std::map<std::string, std::string> folder_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files[entry.path().filename().string()] = test::read_file(entry.path());
  return files;
}

// A failed run must leave what the output folder held; and writing replaces files, never writes
// through them (a shard there that links to an input file kept the input; it used to be truncated).
TEST(QuantizeCheckpoint, AFailedRunLeavesTheOutputFolderAsItWas) {
  const std::string original_dir = test::synth_checkpoint("tiny");
  test::TempDir out, poisoned;
  quantize_checkpoint(original_dir, out.path(), WeightFormat::Q8, false);
  const auto before = folder_files(out.path());
  test::copy_folder_files(original_dir, poisoned.path());
  test::overwrite_tensor_start(poisoned.path(), "model.language_model.layers.1.mlp.down_proj.weight", "\xc0\x7f");
  try {
    quantize_checkpoint(poisoned.path(), out.path(), WeightFormat::Q4, false);
    ADD_FAILURE() << "a NaN weight was quantized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1.mlp.down_proj"), std::string::npos) << e.what();
  }
  EXPECT_EQ(folder_files(out.path()), before) << "the earlier checkpoint is intact, and no staging is left";
  EXPECT_EQ(Gemma4Checkpoint::open(out.path())->weights.embed.format, WeightFormat::Q8);

  test::TempDir linked;
  const auto inputs = folder_files(original_dir);
  for (const auto& [name, bytes] : inputs) fs::create_symlink(fs::path(original_dir) / name, linked.file(name));
  quantize_checkpoint(original_dir, linked.path(), WeightFormat::Q8, false);
  EXPECT_EQ(folder_files(original_dir), inputs) << "the inputs the links pointed to are untouched";
  EXPECT_EQ(Gemma4Checkpoint::open(linked.path())->weights.embed.format, WeightFormat::Q8);
}

// A checkpoint the loader would refuse is refused before anything is written (it used to be
// quantized into a folder the loader then refused).
TEST(QuantizeCheckpoint, RefusesWhatTheLoaderWouldRefuse) {
  test::TempDir in, out;
  test::copy_folder_files(test::synth_checkpoint("tiny"), in.path());
  nlohmann::json config = nlohmann::json::parse(test::read_file(in.file("config.json")));
  nlohmann::json& text = config.contains("text_config") ? config["text_config"] : config;
  text["intermediate_size"] = text["intermediate_size"].get<int>() * 2;
  test::write_file(in.file("config.json"), config.dump());
  try {
    quantize_checkpoint(in.path(), out.path(), WeightFormat::Q8, false);
    ADD_FAILURE() << "quantized a checkpoint whose shapes disagree with config.json";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mlp.gate_proj.weight' has shape"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_empty(out.path()));
}

// A row-parallel matrix (o, down) whose rank share splits a block of 32 quantized columns cannot be
// sharded; the refusal names the file and the tensor, and what to do instead. tiny-odd's query heads
// are 40 wide: two of its four heads per rank make o_proj's shares [0, 80) and [80, 160).
TEST(QuantizeCheckpoint, ARankShareThatSplitsABlockIsRefusedNamingTheTensor) {
  test::TempDir q8;
  quantize_checkpoint(test::synth_checkpoint("tiny-odd"), q8.path(), WeightFormat::Q8, false);
  EXPECT_NO_THROW(Gemma4Checkpoint::open(q8.path())) << "one rank takes whole rows";
  try {
    Gemma4Checkpoint::open(q8.path(), ShardPlan{1, 2});
    ADD_FAILURE() << "sharded a quantized block between two ranks";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("/model-00001-of-00002.safetensors: "), std::string::npos) << message;
    EXPECT_NE(message.find("layers.0.self_attn.o_proj.weight' is quantized in blocks of 32"), std::string::npos)
        << message;
    EXPECT_NE(message.find("[80, 160)"), std::string::npos) << message;
  }
}

TEST(QuantizeCheckpoint, RefusesQuantizedInputAndSameFolder) {
  const std::string original_dir = test::synth_checkpoint("tiny");
  test::TempDir out, again;
  quantize_checkpoint(original_dir, out.path(), WeightFormat::Q4, false);
  EXPECT_THROW(quantize_checkpoint(out.path(), again.path(), WeightFormat::Q8, false), Error);
  EXPECT_THROW(quantize_checkpoint(original_dir, original_dir, WeightFormat::Q8, false), Error);
  EXPECT_THROW(quantize_checkpoint(original_dir, again.path(), WeightFormat::BF16, false), Error);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

TEST(QuantizeCommand, WritesALoadableCheckpoint) {
  const std::string original_dir = test::synth_checkpoint("tiny");
  test::TempDir out;
  const auto ok = test::run(test::shell_quote(test::tandem_binary()) + " quantize --model " +
                            test::shell_quote(original_dir) + " --type q4 --out " + test::shell_quote(out.path()));
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("quantized to q4"), std::string::npos) << ok.err;
  EXPECT_EQ(Gemma4Checkpoint::open(out.path())->weights.embed.format, WeightFormat::Q4);

  const auto bad = test::run(test::shell_quote(test::tandem_binary()) + " quantize --model " +
                             test::shell_quote(original_dir) + " --type q3 --out " + test::shell_quote(out.path()));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("q3"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tandem
