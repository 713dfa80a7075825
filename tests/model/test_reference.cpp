// The float32 reference forward: agreement with the independent golden logits, and the KV-cache
// invariants (chunked prefill == one-shot prefill == token-by-token decode) on E4B- and E2B-like
// tiny checkpoints. Also: checkpoints that don't match their config are refused by name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/checkpoint.h"
#include "model/reference.h"
#include "support/test_support.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

using test::pseudo_random_ids;

TEST(ReferenceModel, MatchesGoldenLogits) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  const auto golden = nlohmann::json::parse(test::read_file(test::shared_dir() + "/golden/tiny-e4b.json"));
  ReferenceModel model(ckpt->config, ckpt->weights);
  for (const auto& c : golden["cases"]) {
    model.reset();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto rows = model.forward(ids);
    ASSERT_EQ(rows.size(), c["logits"].size());
    for (size_t p = 0; p < rows.size(); ++p)
      ASSERT_LE(max_abs_diff(rows[p], c["logits"][p].get<std::vector<float>>()), 1e-3f) << "position " << p;
  }
}

// Feeding the prompt in chunks, or one token at a time, must give the same logits as one call.
void expect_cache_invariants(const std::string& dir, int length) {
  auto ckpt = Gemma4Checkpoint::open(dir);
  const auto ids = pseudo_random_ids(length, ckpt->config.vocab_size, 99);
  ReferenceModel model(ckpt->config, ckpt->weights);
  const auto whole = model.forward(ids);
  for (const std::vector<int>& chunks : {std::vector<int>{1, 6, 17, length - 24}, std::vector<int>{length / 2, length - length / 2}}) {
    model.reset();
    size_t at = 0;
    for (int n : chunks) {
      const auto rows = model.forward(std::span(ids).subspan(at, size_t(n)));
      for (size_t r = 0; r < rows.size(); ++r)
        ASSERT_LE(max_abs_diff(rows[r], whole[at + r]), 1e-5f) << "chunked, position " << at + r;
      at += size_t(n);
    }
  }
  model.reset();
  for (size_t p = 0; p < ids.size(); ++p) {
    const auto row = model.forward(std::span(ids).subspan(p, 1));
    ASSERT_LE(max_abs_diff(row[0], whole[p]), 1e-5f) << "decode step, position " << p;
  }
  EXPECT_EQ(model.position(), length);
}

TEST(ReferenceModel, ChunkedPrefillAndDecodeMatchOneShotE4BLike) {
  expect_cache_invariants(test::golden_tiny_checkpoint(), 70);  // window 16: spans several windows
}

TEST(ReferenceModel, ChunkedPrefillAndDecodeMatchOneShotE2BLike) {
  expect_cache_invariants(test::synth_checkpoint("tiny-e2b"), 50);  // 1 KV head, double-wide MLP, window 8
}

TEST(ReferenceModel, LastPositionOnlyEqualsLastRow) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  ReferenceModel model(ckpt->config, ckpt->weights);
  const auto ids = pseudo_random_ids(20, 512, 3);
  const auto all = model.forward(ids);
  model.reset();
  const auto last = model.forward(ids, false);
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(max_abs_diff(last[0], all.back()), 0.0f);
}

TEST(ReferenceModel, RejectsTokenOutsideVocabulary) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  ReferenceModel model(ckpt->config, ckpt->weights);
  const int32_t ids[] = {2, 512};
  EXPECT_THROW(model.forward(ids), Error);
}

// Copies the golden checkpoint into one model.safetensors, dropping `skip`.
void rewrite_without(const std::string& from, const std::string& to, const std::string& skip) {
  CheckpointFiles files(from);
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> kept;
  for (const TensorInfo* t : files.tensors()) {
    if (t->name == skip) continue;
    specs.push_back({t->name, t->dtype, t->shape});
    kept.push_back(t);
  }
  SafetensorsWriter writer(to + "/model.safetensors", specs);
  for (const TensorInfo* t : kept) writer.write(t->data, t->nbytes);
  writer.finish();
  fs::copy_file(from + "/config.json", to + "/config.json");
}

std::string open_error(const std::string& dir) {
  try {
    Gemma4Checkpoint::open(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Checkpoint, MissingTensorIsNamed) {
  test::TempDir dir;
  const std::string name = "model.language_model.layers.3.mlp.up_proj.weight";
  rewrite_without(test::golden_tiny_checkpoint(), dir.path(), name);
  EXPECT_THAT(open_error(dir.path()), AllOf(HasSubstr("missing tensor"), HasSubstr(name)));
}

TEST(Checkpoint, UnusedSharedLayerKvAndVisionTensorsAreNotNeeded) {
  test::TempDir dir;  // layer 9 shares K/V: its k_proj is in the file but must not be required
  rewrite_without(test::golden_tiny_checkpoint(), dir.path(), "model.language_model.layers.9.self_attn.k_proj.weight");
  EXPECT_NO_THROW(Gemma4Checkpoint::open(dir.path()));
}

// The golden checkpoint in one file, plus a copy of tensor `source` named `extra`.
void rewrite_with_extra(const std::string& from, const std::string& to, const std::string& source,
                        const std::string& extra) {
  CheckpointFiles files(from);
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> kept;
  for (const TensorInfo* t : files.tensors()) {
    specs.push_back({t->name, t->dtype, t->shape});
    kept.push_back(t);
    if (t->name == source) {
      specs.push_back({extra, t->dtype, t->shape});
      kept.push_back(t);
    }
  }
  SafetensorsWriter writer(to + "/model.safetensors", specs);
  for (const TensorInfo* t : kept) writer.write(t->data, t->nbytes);
  writer.finish();
  fs::copy_file(from + "/config.json", to + "/config.json");
}

// Text-model tensors config.json leaves no place for are refused, not ignored (which would run
// another model than the checkpoint holds).
TEST(Checkpoint, TensorsTheConfigHasNoPlaceForAreRefused) {
  const std::string golden = test::golden_tiny_checkpoint(), p = "model.language_model.";
  {
    test::TempDir dir;
    rewrite_with_extra(golden, dir.path(), p + "layers.0.mlp.gate_proj.weight", p + "layers.99.mlp.gate_proj.weight");
    EXPECT_THAT(open_error(dir.path()), AllOf(HasSubstr(p + "layers.99.mlp.gate_proj.weight"), HasSubstr("is for layer 99")));
  }
  {
    test::TempDir dir;
    rewrite_with_extra(golden, dir.path(), p + "layers.2.post_attention_layernorm.weight", p + "layers.2.mlp.bias");
    EXPECT_THAT(open_error(dir.path()), AllOf(HasSubstr(p + "layers.2.mlp.bias"), HasSubstr("not a weight")));
  }
  {
    test::TempDir dir;
    rewrite_without(golden, dir.path(), "");
    auto config = nlohmann::json::parse(test::read_file(dir.file("config.json")));
    config["text_config"]["hidden_size_per_layer_input"] = 0;
    test::write_file(dir.file("config.json"), config.dump());
    EXPECT_THAT(open_error(dir.path()), HasSubstr("sets hidden_size_per_layer_input to 0"));
  }
}

TEST(Checkpoint, ShapeThatDisagreesWithConfigIsNamed) {
  test::TempDir dir;
  for (const auto& e : fs::directory_iterator(test::golden_tiny_checkpoint()))
    fs::copy_file(e.path(), dir.path() + "/" + e.path().filename().string());
  auto config = nlohmann::json::parse(test::read_file(dir.file("config.json")));
  config["text_config"]["intermediate_size"] = 256;
  test::write_file(dir.file("config.json"), config.dump());
  EXPECT_THAT(open_error(dir.path()),
              AllOf(HasSubstr("model-00001-of-00002.safetensors"), HasSubstr("layers.0.mlp.gate_proj.weight"),
                    HasSubstr("[512, 128]"), HasSubstr("[256, 128]")));
}

TEST(Checkpoint, MissingConfig) {
  test::TempDir dir;
  EXPECT_THAT(open_error(dir.path()), HasSubstr("missing config.json"));
}

TEST(Checkpoint, TextOnlyPrefixLoads) {
  test::TempDir dir;  // a Gemma4ForCausalLM export: weights under "model." with a flat config
  CheckpointFiles files(test::golden_tiny_checkpoint());
  std::vector<TensorSpec> specs;
  std::vector<const TensorInfo*> kept;
  const std::string prefix = "model.language_model.";
  for (const TensorInfo* t : files.tensors()) {
    if (t->name.rfind(prefix, 0) != 0) continue;
    specs.push_back({"model." + t->name.substr(prefix.size()), t->dtype, t->shape});
    kept.push_back(t);
  }
  {
    SafetensorsWriter writer(dir.file("model.safetensors"), specs);
    for (const TensorInfo* t : kept) writer.write(t->data, t->nbytes);
    writer.finish();
  }
  auto config = nlohmann::json::parse(test::read_file(test::golden_tiny_checkpoint() + "/config.json"));
  test::write_file(dir.file("config.json"), config["text_config"].dump());
  auto text_only = Gemma4Checkpoint::open(dir.path());
  auto original = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  EXPECT_EQ(text_only->weights.prefix, "model.");
  ReferenceModel a(text_only->config, text_only->weights), b(original->config, original->weights);
  const auto ids = pseudo_random_ids(10, 512, 5);
  EXPECT_EQ(max_abs_diff(a.forward(ids, false)[0], b.forward(ids, false)[0]), 0.0f);
}

}  // namespace
}  // namespace tandem
