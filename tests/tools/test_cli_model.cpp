// The `tandem` command end to end: golden logits and greedy ids through `logits` and `generate`,
// `synth` writing the published layout, `inspect`, and clear errors with a non-zero exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "kernels/cpu/kernels.h"
#include "model/quantize_checkpoint.h"
#include "support/test_support.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;
using nlohmann::json;
namespace fs = std::filesystem;

std::string tandem_cmd(const std::string& args) { return test::shell_quote(test::tandem_binary()) + " " + args; }

std::string join_ids(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(id);
  }
  return s;
}

class Golden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    golden_ = json::parse(test::read_file(test::shared_dir() + "/golden/tiny-e4b.json"));
    model_ = test::golden_tiny_checkpoint();
  }
  static json golden_;
  static std::string model_;
};
json Golden::golden_;
std::string Golden::model_;

TEST_F(Golden, LogitsAgreeWithIndependentImplementation) {
  for (const auto& c : golden_["cases"]) {
    const auto ids = c["ids"].get<std::vector<int>>();
    for (int threads : {1, 2}) {
      auto r = test::run(tandem_cmd("logits --model " + model_ + " --ids " + join_ids(ids) + " --threads " + std::to_string(threads)));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const json out = json::parse(r.out);
      ASSERT_EQ(out["logits"].size(), ids.size());
      for (size_t p = 0; p < ids.size(); ++p) {
        const auto ours = out["logits"][p].get<std::vector<double>>();
        const auto theirs = c["logits"][p].get<std::vector<double>>();
        ASSERT_EQ(ours.size(), theirs.size());
        for (size_t v = 0; v < ours.size(); ++v)
          ASSERT_NEAR(ours[v], theirs[v], 1e-3) << "prompt length " << ids.size() << " position " << p << " token " << v;
      }
    }
  }
}

TEST_F(Golden, GreedyIdsMatchExactly) {
  for (const auto& c : golden_["cases"]) {
    const auto ids = c["ids"].get<std::vector<int>>();
    auto r = test::run(tandem_cmd("generate --model " + model_ + " --ids " + join_ids(ids) + " --max-tokens 20 --ignore-eos"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["ids"].get<std::vector<int>>(), c["greedy"].get<std::vector<int>>())
        << "prompt length " << ids.size();
  }
}

TEST_F(Golden, GenerateStopsAtStopTokensUnlessIgnored) {
  // Find a prompt whose greedy continuation hits a stop token (1, 50 or 106) within 20 steps in
  // the golden data; when there is none, generation must simply run to max-tokens.
  for (const auto& c : golden_["cases"]) {
    const auto greedy = c["greedy"].get<std::vector<int>>();
    size_t stop_at = greedy.size();
    for (size_t i = 0; i < greedy.size(); ++i)
      if (greedy[i] == 1 || greedy[i] == 50 || greedy[i] == 106) { stop_at = i; break; }
    auto r = test::run(tandem_cmd("generate --model " + model_ + " --ids " + join_ids(c["ids"].get<std::vector<int>>()) + " --max-tokens 20"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(json::parse(r.out)["ids"].get<std::vector<int>>(),
              std::vector<int>(greedy.begin(), greedy.begin() + long(stop_at)));
  }
}

TEST(Synth, WritesThePublishedLayout) {
  const std::string dir = test::synth_checkpoint("tiny-e2b");
  const json config = json::parse(test::read_file(dir + "/config.json"));
  EXPECT_EQ(config["model_type"], "gemma4");
  EXPECT_EQ(config["text_config"]["model_type"], "gemma4_text");
  const json index = json::parse(test::read_file(dir + "/model.safetensors.index.json"));
  const auto& map = index["weight_map"];
  EXPECT_TRUE(map.contains("model.vision_tower.patch_embedder.input_proj.weight"));
  EXPECT_TRUE(map.contains("model.language_model.layers.9.self_attn.k_proj.weight"));  // unused, as published
  EXPECT_FALSE(map.contains("lm_head.weight"));
  std::set<std::string> shards;
  for (auto& [name, file] : map.items()) shards.insert(file.get<std::string>());
  EXPECT_EQ(shards.size(), 2u);
  for (const auto& s : shards) EXPECT_TRUE(fs::exists(dir + "/" + s));
  EXPECT_TRUE(fs::exists(dir + "/generation_config.json"));
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherBytes) {
  test::TempDir a, b, c;
  ASSERT_EQ(test::run(tandem_cmd("synth --preset tiny --seed 5 --out " + a.path())).exit_code, 0);
  ASSERT_EQ(test::run(tandem_cmd("synth --preset tiny --seed 5 --out " + b.path())).exit_code, 0);
  ASSERT_EQ(test::run(tandem_cmd("synth --preset tiny --seed 6 --out " + c.path())).exit_code, 0);
  const std::string shard = "/model-00001-of-00002.safetensors";
  EXPECT_EQ(test::read_file(a.path() + shard), test::read_file(b.path() + shard));
  EXPECT_NE(test::read_file(a.path() + shard), test::read_file(c.path() + shard));
}

TEST(Inspect, ShowsLayerTableAndSkippedTensors) {
  auto r = test::run(tandem_cmd("inspect --model " + test::golden_tiny_checkpoint()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("layer 7"));  // sliding donor
  EXPECT_THAT(r.out, HasSubstr("layer 5"));  // full donor
  EXPECT_THAT(r.out, HasSubstr("(skipped: KV-shared layer)"));
  EXPECT_THAT(r.out, HasSubstr("(skipped: not a text weight)"));
}

// `tandem bench --json` on a small checkpoint (its vocabulary is smaller than the ids a full one
// gets): every documented key, and the roofline is the ratio the docs define. 39 decode steps are
// three segments, with the batch's steps in turns between them (its KV blocks beside the single
// sequence's).
TEST(Bench, JsonReportsEveryKeyAndTheRooflineRatio) {
  const std::string model = test::synth_checkpoint("tiny");
  auto r = test::run(tandem_cmd("bench --model " + model + " --prompt 40 --gen 40 --batch 3 --threads 2 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  for (const char* key : {"load_s", "prefill_tok_s", "decode_tok_s", "ttft_s", "peak_rss_bytes",
                          "weight_bytes_per_token", "read_bw_gb_s", "roofline", "batch_decode_tok_s",
                          "buffer_read_bw_gb_s", "buffer_roofline"}) {
    ASSERT_TRUE(out.contains(key)) << key;
    EXPECT_GT(out[key].get<double>(), 0.0) << key;
  }
  EXPECT_TRUE(out["peak_rss_bytes"].is_number_integer()) << out["peak_rss_bytes"] << " bytes are a count";
  // Weights smaller than the probe's buffer would be read from the caches: the buffer stands in.
  EXPECT_EQ(out["read_bw_of"].get<std::string>(), "buffer");
  EXPECT_EQ(out["read_bw_gb_s"].get<double>(), out["buffer_read_bw_gb_s"].get<double>());
  EXPECT_EQ(out["roofline"].get<double>(), out["buffer_roofline"].get<double>());
  // With a probe buffer smaller than the weights, resident weights are read in its place (mapped
  // ones never: they may be on disk).
  auto read_of = [&](const std::string& options) {
    auto r = test::run(tandem_cmd("bench --model " + model + " --prompt 8 --gen 2 --batch 1 --threads 2 --json " + options));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json::object();
  };
  const json weights = read_of("--probe-mb 1");
  EXPECT_EQ(weights.value("read_bw_of", ""), "weights");
  EXPECT_GT(weights.value("read_bw_gb_s", 0.0), 0.0);
  EXPECT_NEAR(weights.value("roofline", 0.0),
              weights.value("decode_tok_s", 0.0) * weights.value("weight_bytes_per_token", 0.0) /
                  (weights.value("read_bw_gb_s", 1.0) * 1e9),
              1e-6 * weights.value("roofline", 1.0));
  EXPECT_EQ(read_of("--probe-mb 1 --weights mapped").value("read_bw_of", ""), "buffer");
  EXPECT_NEAR(out["prefill_tok_s"].get<double>() * out["ttft_s"].get<double>(), 40.0, 1e-6);
  const double expected_roofline = out["decode_tok_s"].get<double>() * out["weight_bytes_per_token"].get<double>() /
                                   (out["read_bw_gb_s"].get<double>() * 1e9);
  EXPECT_NEAR(out["roofline"].get<double>(), expected_roofline, 1e-6 * expected_roofline);
  EXPECT_EQ(out["batch"].get<int>(), 3);
}

// A prompt longer than --prefill-chunk is prefilled in several steps, as a server takes it; the
// default chunk holds the 512-token prompt of the figures in one step.
TEST(Bench, LongPromptsArePrefilledInSteps) {
  const std::string model = test::synth_checkpoint("tiny");
  auto steps = [&](const std::string& options) {
    auto r = test::run(tandem_cmd("bench --model " + model + " --gen 2 --batch 1 --threads 2 --json " + options));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out).value("prefill_steps", 0) : 0;
  };
  EXPECT_EQ(steps("--prompt 40 --prefill-chunk 16"), 3);
  EXPECT_EQ(steps("--prompt 32 --prefill-chunk 16"), 2);
  EXPECT_EQ(steps("--prompt 512"), 1);
}

// The default thread count is the CPUs the process may run on: pinned to one CPU (as a container's
// cpuset pins it), two spinning threads would share it and halve the speed.
TEST(Bench, DefaultThreadsFollowTheAffinityMask) {
  if (std::system("command -v taskset >/dev/null 2>&1") != 0) GTEST_SKIP() << "taskset is not installed";
  const std::string model = test::synth_checkpoint("tiny");
  auto r = test::run("taskset -c 0 " + tandem_cmd("bench --model " + model + " --prompt 8 --gen 2 --batch 1 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json::parse(r.out).value("threads_per_rank", 0), 1);
}

// --profile: each phase's steps split by kind of op call. A step of the tiny model calls attention
// once per layer and the LM head once, and the ops' time lies within the step's.
TEST(Bench, ProfileSplitsEachStepByOp) {
  const std::string model = test::synth_checkpoint("tiny");
  const json config_file = json::parse(test::read_file(model + "/config.json"));
  const json& config = config_file.contains("text_config") ? config_file["text_config"] : config_file;
  const int layers = config["num_hidden_layers"].get<int>();
  auto r = test::run(tandem_cmd("bench --model " + model + " --prompt 8 --gen 5 --batch 2 --threads 2 --json --profile"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json out = json::parse(r.out);
  ASSERT_TRUE(out.contains("profile"));
  for (const char* phase : {"decode", "batch"}) {
    const json& p = out["profile"][phase];
    EXPECT_EQ(p["steps"].get<int>(), 4) << phase;  // --gen 5: 4 decode steps; batches at least 4
    double attention_calls = 0, lm_head_calls = 0, outside = -1;
    const std::string lm_head = "matmul " + std::to_string(config["vocab_size"].get<int>()) + "x" +
                                std::to_string(config["hidden_size"].get<int>());
    for (const json& op : p["ops"]) {
      const std::string what = op["op"].get<std::string>();
      if (what.rfind("attention", 0) == 0) attention_calls += op["calls_per_step"].get<double>();
      if (what == lm_head) lm_head_calls += op["calls_per_step"].get<double>();
      if (what == "outside the ops") outside = op["ms_per_step"].get<double>();
    }
    EXPECT_EQ(attention_calls, layers) << phase;
    EXPECT_EQ(lm_head_calls, 1) << phase;
    EXPECT_GE(outside, 0.0) << phase;  // the ops' time lies within the step's
    EXPECT_LT(outside, p["ms_per_step"].get<double>()) << phase;
  }
  auto text = test::run(tandem_cmd("bench --model " + model + " --prompt 8 --gen 2 --batch 1 --threads 2 --profile"));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("where a step's time goes"));
  EXPECT_THAT(text.out, HasSubstr("outside the ops"));
}

// kv_bytes_per_token: the K/V bytes one decoded token's attention reads, from the published
// config's fields: each layer the keys its position sees (sliding layers at most the window) times
// its KV heads, head size, K and V, and the element size; the mean over the decode steps (a prompt
// of 40 and 3 tokens: steps at positions 40 and 41). roofline_with_kv adds them to the weights.
TEST(Bench, KvBytesPerTokenCountWhatEachLayerReads) {
  const std::string model = test::synth_checkpoint("tiny");
  json config = json::parse(test::read_file(model + "/config.json"));
  if (config.contains("text_config")) config = config["text_config"];
  const int window = config["sliding_window"].get<int>();
  double expected_f32 = 0;
  for (int position : {40, 41}) {
    for (const auto& type : config["layer_types"]) {
      const bool full = type.get<std::string>() == "full_attention";
      const json& global_heads = config["num_global_key_value_heads"];
      const int heads =
          full && !global_heads.is_null() ? global_heads.get<int>() : config["num_key_value_heads"].get<int>();
      const int head_dim = full ? config["global_head_dim"].get<int>() : config["head_dim"].get<int>();
      const int keys = full ? position + 1 : std::min(position + 1, window);
      expected_f32 += double(keys) * heads * head_dim * 2 * 4 / 2;  // mean of the two steps
    }
  }
  for (const std::string dtype : {"f32", "bf16"}) {
    auto r = test::run(
        tandem_cmd("bench --model " + model + " --prompt 40 --gen 3 --batch 1 --threads 2 --json --kv-dtype " + dtype));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json out = json::parse(r.out);
    const double expected = dtype == "f32" ? expected_f32 : expected_f32 / 2;
    EXPECT_DOUBLE_EQ(out["kv_bytes_per_token"].get<double>(), expected) << dtype;
    const double with_kv = out["decode_tok_s"].get<double>() *
                           (out["weight_bytes_per_token"].get<double>() + out["kv_bytes_per_token"].get<double>()) /
                           (out["read_bw_gb_s"].get<double>() * 1e9);
    EXPECT_NEAR(out["roofline_with_kv"].get<double>(), with_kv, 1e-6 * with_kv) << dtype;
  }
}

// --kv-dtype auto (the default): an f32 cache for float weights, bf16 for quantized ones; an explicit
// choice wins. The cache's bytes read per token follow the element type actually used.
TEST(Bench, KvDtypeAutoIsF32ForFloatWeightsAndBf16ForQuantized) {
  const std::string original = test::synth_checkpoint("tiny");
  test::TempDir q8;
  quantize_checkpoint(original, q8.path(), WeightFormat::Q8, false);
  auto bench = [&](const std::string& model, const std::string& options) {
    auto r = test::run(tandem_cmd("bench --model " + model + " --prompt 24 --gen 2 --batch 1 --threads 2 --json" + options));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out) : json::object();
  };
  const json float_default = bench(original, ""), q8_default = bench(q8.path(), ""), q8_f32 = bench(q8.path(), " --kv-dtype f32");
  EXPECT_EQ(float_default.value("kv_dtype", ""), "f32");
  EXPECT_EQ(q8_default.value("kv_dtype", ""), "bf16");
  EXPECT_EQ(q8_f32.value("kv_dtype", ""), "f32");
  EXPECT_EQ(bench(original, " --kv-dtype bf16").value("kv_dtype", ""), "bf16");
  ASSERT_TRUE(q8_default.contains("kv_bytes_per_token") && q8_f32.contains("kv_bytes_per_token"));
  EXPECT_DOUBLE_EQ(q8_default["kv_bytes_per_token"].get<double>() * 2, q8_f32["kv_bytes_per_token"].get<double>());
}

// --weight-layout: auto loads the row groups (interleaved) wherever this CPU's kernels read them,
// for one sequence as for batches; an explicit choice wins; mapped weights cannot be rearranged.
TEST(Bench, WeightLayoutAutoTakesTheRowGroupsTheKernelsRead) {
  test::TempDir q8;
  quantize_checkpoint(test::synth_checkpoint("tiny"), q8.path(), WeightFormat::Q8, false);  // down_proj: 512 columns
  const std::string row_groups = cpu::active_kernels().interleaved_q8 ? "interleaved" : "plain";
  auto layout = [&](const std::string& options) {
    auto r = test::run(tandem_cmd("bench --model " + q8.path() + " --prompt 16 --gen 2 --threads 2 --json " + options));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.exit_code == 0 ? json::parse(r.out)["weight_layout"].get<std::string>() : std::string("failed");
  };
  EXPECT_EQ(layout("--batch 1"), row_groups);
  EXPECT_EQ(layout("--batch 2"), row_groups);
  EXPECT_EQ(layout("--batch 2 --weight-layout plain"), "plain");
  EXPECT_EQ(layout("--batch 1 --weight-layout interleaved"), row_groups);
  EXPECT_EQ(layout("--batch 2 --weights mapped"), "plain");
  auto r = test::run(tandem_cmd("bench --model " + q8.path() + " --weight-layout interleaved --weights mapped --json"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--weight-layout interleaved needs --weights resident"));
  // Q4 too.
  test::TempDir q4;
  quantize_checkpoint(test::synth_checkpoint("tiny"), q4.path(), WeightFormat::Q4, false);
  auto r4 = test::run(tandem_cmd("bench --model " + q4.path() + " --prompt 16 --gen 2 --threads 2 --batch 1 --json"));
  ASSERT_EQ(r4.exit_code, 0) << r4.err;
  EXPECT_EQ(json::parse(r4.out)["weight_layout"].get<std::string>(),
            cpu::active_kernels().interleaved_q4 ? "interleaved" : "plain");
  // So does BF16, where the AVX-512 float kernels read its row groups.
  auto rb = test::run(tandem_cmd("bench --model " + test::synth_checkpoint("tiny") +
                                 " --prompt 16 --gen 2 --threads 2 --batch 1 --json"));
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  EXPECT_EQ(json::parse(rb.out)["weight_layout"].get<std::string>(),
            cpu::active_kernels().interleaved_float ? "interleaved" : "plain");
  r = test::run(tandem_cmd("generate --model " + q8.path() + " --ids 2,5 --weight-layout sideways"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("--weight-layout"));
}

TEST(CliErrors, BadInputGivesMessageAndNonZeroExit) {
  const std::string model = test::golden_tiny_checkpoint();
  struct Case {
    std::string args, message;
  } cases[] = {
      {"logits --model " + model + " --ids 2,x,5", "not a token id"},
      {"logits --model " + model + " --ids 2,,5", "not a token id"},
      {"logits --model " + model + " --ids 2,512", "outside the vocabulary"},
      {"generate --model " + model + " --ids 2 --max-tokens -1", "--max-tokens"},
      {"generate --model " + model + " --ids 2 --max-tokens 2147483647", "exceed the model's context"},
      {"bench --model " + model + " --prompt 4 --gen 1", "--gen must be at least 2"},
      {"bench --model " + model + " --prompt 200000 --gen 2", "exceed the model's context"},
      {"bench --model " + model + " --prefill-chunk 0", "--prefill-chunk"},
      {"logits --model /nonexistent --ids 2", "/nonexistent"},
      // An empty --model (an unset variable) is an error, not the demo model written to the home folder.
      {"generate --model '' --ids 2", "--model: an empty path"},
      {"serve --model '' --port 0", "--model: an empty path"},
      {"logits --model /nonexistent --ids 2", "no such folder"},
      {"logits --model " + model + "/config.json --ids 2", "not a folder"},
      {"generate --model " + model + " --ids 2 --threads -1", "--threads"},
      {"serve --model " + model + " --port 0 --shutdown-timeout nan", "--shutdown-timeout"},
      {"serve --model " + model + " --port 0 --http-threads -5", "--http-threads"},
      {"synth --preset huge --out /tmp/never", "unknown preset"},
  };
  for (const auto& c : cases) {
    auto r = test::run(tandem_cmd(c.args));
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
  }
}

}  // namespace
}  // namespace tandem
