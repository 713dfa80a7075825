// Gemma 4 config parsing and the derived layer table, on the real E4B/E2B shapes and variants.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "model/config.h"
#include "model/rope.h"
#include "model/shard_plan.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;

json layer_types(int layers, int period) {
  json t = json::array();
  for (int i = 0; i < layers; ++i) t.push_back((i + 1) % period ? "sliding_attention" : "full_attention");
  return t;
}

// text_config of google/gemma-4-E4B-it, as published.
json e4b_text() {
  return {{"model_type", "gemma4_text"}, {"hidden_size", 2560}, {"num_hidden_layers", 42},
          {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 256}, {"global_head_dim", 512},
          {"intermediate_size", 10240}, {"use_double_wide_mlp", false}, {"vocab_size", 262144},
          {"vocab_size_per_layer_input", 262144}, {"hidden_size_per_layer_input", 256},
          {"num_kv_shared_layers", 18}, {"layer_types", layer_types(42, 6)}, {"sliding_window", 512},
          {"final_logit_softcapping", 30.0}, {"rms_norm_eps", 1e-6},
          {"rope_parameters",
           {{"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}},
            {"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}, {"rope_theta", 1e6}}}}}};
}

json e2b_text() {
  json t = e4b_text();
  t["hidden_size"] = 1536;
  t["num_hidden_layers"] = 35;
  t["num_key_value_heads"] = 1;
  t["intermediate_size"] = 6144;
  t["use_double_wide_mlp"] = true;
  t["num_kv_shared_layers"] = 20;
  t["layer_types"] = layer_types(35, 5);
  return t;
}

json nested(const json& text) {
  return {{"model_type", "gemma4"}, {"architectures", {"Gemma4ForConditionalGeneration"}},
          {"text_config", text}, {"eos_token_id", {1, 106}}};
}

std::string error_of(const json& j) {
  try {
    Gemma4Config::from_json(j, "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Config, E4BLayerTable) {
  const Gemma4Config c = Gemma4Config::from_json(nested(e4b_text()), "config.json");
  EXPECT_EQ(c.first_kv_shared_layer(), 24);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1, 106}));
  for (int i = 0; i < 42; ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const bool full = i % 6 == 5;
    EXPECT_EQ(l.kind, full ? AttentionKind::Full : AttentionKind::Sliding) << i;
    EXPECT_EQ(l.head_dim, full ? 512 : 256) << i;
    EXPECT_EQ(l.mlp_width, 10240) << i;
    EXPECT_EQ(l.shares_kv, i >= 24) << i;
    EXPECT_EQ(l.kv_layer, i < 24 ? i : (full ? 23 : 22)) << i;
  }
}

TEST(Config, E2BLayerTableHasDoubleWideMlpOnSharedLayers) {
  const Gemma4Config c = Gemma4Config::from_json(nested(e2b_text()), "config.json");
  EXPECT_EQ(c.first_kv_shared_layer(), 15);
  for (int i = 0; i < 35; ++i) {
    const LayerConfig& l = c.layers[size_t(i)];
    const bool full = i % 5 == 4;
    EXPECT_EQ(l.num_kv_heads, 1);
    EXPECT_EQ(l.mlp_width, i >= 15 ? 12288 : 6144) << i;
    EXPECT_EQ(l.kv_layer, i < 15 ? i : (full ? 14 : 13)) << i;
  }
}

TEST(Config, DonorIsLastOwningLayerOfTheSameKind) {
  // The golden tiny layout: full layers 5 and 11, layers 8-11 share: donors are 7 and 5, not 6/7.
  json t = e4b_text();
  t["num_hidden_layers"] = 12;
  t["num_kv_shared_layers"] = 4;
  t["layer_types"] = layer_types(12, 6);
  const Gemma4Config c = Gemma4Config::from_json(nested(t), "config.json");
  EXPECT_EQ(c.layers[8].kv_layer, 7);
  EXPECT_EQ(c.layers[10].kv_layer, 7);
  EXPECT_EQ(c.layers[11].kv_layer, 5);
}

TEST(Config, FlatTextOnlyConfig) {
  json t = e4b_text();
  t["eos_token_id"] = 1;
  const Gemma4Config c = Gemma4Config::from_json(t, "config.json");
  EXPECT_EQ(c.hidden_size, 2560);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{1}));
}

TEST(Config, PerLayerConfigWithZeroPaddedKeys) {
  json t = e4b_text();
  t.erase("global_head_dim");
  json overrides = json::object();
  for (int i = 5; i < 42; i += 6) overrides[(i < 10 ? "0" : "") + std::to_string(i)] = {{"head_dim", 512}};
  t["per_layer_config"] = overrides;
  const Gemma4Config c = Gemma4Config::from_json(nested(t), "config.json");
  EXPECT_EQ(c.layers[5].head_dim, 512);
  EXPECT_EQ(c.layers[41].head_dim, 512);
  EXPECT_EQ(c.layers[4].head_dim, 256);
}

TEST(Config, DefaultsFollowHuggingFace) {
  json t = e4b_text();
  t.erase("layer_types");
  t.erase("rope_parameters");
  t.erase("global_head_dim");
  t["num_hidden_layers"] = 8;  // default pattern 5:1, the last layer forced to full
  t["num_kv_shared_layers"] = 0;
  const Gemma4Config c = Gemma4Config::from_json(nested(t), "config.json");
  EXPECT_EQ(c.layers[5].kind, AttentionKind::Full);
  EXPECT_EQ(c.layers[6].kind, AttentionKind::Sliding);
  EXPECT_EQ(c.layers[7].kind, AttentionKind::Full);
  EXPECT_EQ(c.layers[7].head_dim, 512);
  EXPECT_EQ(c.rope_full.type, "proportional");
  EXPECT_EQ(c.rope_full.theta, 1e6);
}

TEST(Config, MissingOrInvalidFieldsAreNamed) {
  for (const char* field : {"hidden_size", "num_hidden_layers", "intermediate_size", "num_key_value_heads"}) {
    json t = e4b_text();
    t.erase(field);
    EXPECT_THAT(error_of(nested(t)), HasSubstr(std::string("text_config.") + field + " is missing"));
  }
  json t = e4b_text();
  t["hidden_size"] = "big";
  EXPECT_THAT(error_of(nested(t)), HasSubstr("text_config.hidden_size must be an integer"));
  t = e4b_text();
  t["layer_types"] = json::array({"sliding_attention"});
  EXPECT_THAT(error_of(nested(t)), HasSubstr("layer_types"));
  t = e4b_text();
  t["hidden_activation"] = "relu";
  EXPECT_THAT(error_of(nested(t)), HasSubstr("hidden_activation"));
  t = e4b_text();
  t["num_attention_heads"] = 7;
  EXPECT_THAT(error_of(nested(t)), HasSubstr("num_key_value_heads"));
  t = e4b_text();
  t["num_attention_heads"] = 256;
  t["num_key_value_heads"] = 2;
  EXPECT_THAT(error_of(nested(t)), HasSubstr("query heads per KV head is not supported"));
  EXPECT_THAT(error_of(json{{"model_type", "gemma4"}}), HasSubstr("text_config is missing"));
  EXPECT_THAT(error_of(json{{"model_type", "llama"}, {"hidden_size", 4}}), HasSubstr("not a Gemma 4"));
}

TEST(Rope, DefaultLadderRotatesEveryDimension) {
  const auto f = rope_inv_freq({"default", 10000.0, 1.0}, 256);
  ASSERT_EQ(f.size(), 128u);
  for (int k = 0; k < 128; ++k) EXPECT_NEAR(f[size_t(k)], std::pow(10000.0, -2.0 * k / 256), 1e-7 * f[size_t(k)] + 1e-12);
}

TEST(Rope, ProportionalUsesTheFullHeadDimAsDenominator) {
  const auto f = rope_inv_freq({"proportional", 1e6, 0.25}, 512);
  ASSERT_EQ(f.size(), 256u);
  for (int k = 0; k < 64; ++k) EXPECT_NEAR(f[size_t(k)], std::pow(1e6, -2.0 * k / 512), 1e-7 * f[size_t(k)]);
  for (int k = 64; k < 256; ++k) EXPECT_EQ(f[size_t(k)], 0.0f);
}

TEST(Rope, RotateHalfPairsDimensionKWithKPlusHalf) {
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0};  // D = 8, half = 4
  const std::vector<float> f = {1.0f, 0.0f, 0.0f, 0.0f};
  apply_rope(x.data(), 8, f.data(), 2);  // dim 0 rotates against dim 4 by 2 radians
  EXPECT_NEAR(x[0], std::cos(2.0f), 1e-6);
  EXPECT_NEAR(x[4], std::sin(2.0f), 1e-6);
  EXPECT_EQ(x[1], 0.0f);
}

TEST(ShardPlan, KeepsTheModelsQueryToKvGrouping) {
  const Gemma4Config c = Gemma4Config::from_json(nested(e4b_text()), "config.json");
  ShardPlan r0{0, 2}, r1{1, 2};
  r0.validate(c);
  const HeadShard h0 = r0.heads(c.layers[0], c.num_heads), h1 = r1.heads(c.layers[0], c.num_heads);
  EXPECT_EQ(h0.q_first, 0);
  EXPECT_EQ(h1.q_first, 4);
  EXPECT_EQ(h0.kv_count, 1);
  EXPECT_EQ(h1.kv_first, 1);
  for (int h = 0; h < 4; ++h) EXPECT_EQ(h1.kv_of(h), 0);  // heads 4-7 read KV head 1, local 0
  // TP=4 replicates: each KV head is held by two ranks; heads 2-3 (rank 1) read KV head 0.
  ShardPlan q1{1, 4}, q2{2, 4};
  EXPECT_EQ(q1.heads(c.layers[0], 8).kv_first, 0);
  EXPECT_EQ(q2.heads(c.layers[0], 8).kv_first, 1);
  const Gemma4Config e2b = Gemma4Config::from_json(nested(e2b_text()), "config.json");
  ShardPlan{1, 2}.validate(e2b);
  EXPECT_EQ(ShardPlan({1, 2}).heads(e2b.layers[0], 8).kv_first, 0);
  EXPECT_THROW(ShardPlan({0, 3}).validate(c), Error);
}

TEST(GenerationConfig, StopTokensFromGenerationConfigOrConfig) {
  const Gemma4Config c = Gemma4Config::from_json(nested(e4b_text()), "config.json");
  const GenerationConfig g = GenerationConfig::load("/nonexistent-dir", c);
  EXPECT_EQ(g.stop_token_ids, (std::vector<int>{1, 106}));
}

}  // namespace
}  // namespace tandem
