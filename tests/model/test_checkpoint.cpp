// Gemma4Checkpoint: non-finite weights refused; warm_ple_table: the PLE table's bytes in the page
// cache, found through the checkpoint's own file mappings (CheckpointFiles::mapping_of).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/memory_bandwidth.h"
#include "core/thread_pool.h"
#include "kernels/cpu/kernels.h"
#include "model/checkpoint.h"
#include "model/quantize_checkpoint.h"
#include "support/test_support.h"

namespace tandem {
namespace {

// Pages of [p, p + bytes) that mincore reports in memory, and the total.
std::pair<size_t, size_t> resident_pages(const uint8_t* p, size_t bytes) {
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = reinterpret_cast<uintptr_t>(p) / page * page;
  const size_t span = reinterpret_cast<uintptr_t>(p) + bytes - first;
  std::vector<unsigned char> flags((span + page - 1) / page);
  EXPECT_EQ(::mincore(reinterpret_cast<void*>(first), span, flags.data()), 0);
  size_t in = 0;
  for (unsigned char f : flags) in += f & 1;
  return {in, flags.size()};
}

// Non-finite weights would come out as plausible tokens (the soft-cap turns NaN logits into -cap, the
// sampler then picks token 0): norms, layer scalars and quantization scales are refused at load,
// naming the tensor, and a NaN that reaches the final hidden state stops generation with an error.
TEST(Checkpoint, NonFiniteWeightsAreRefused) {
  const std::string original = test::synth_checkpoint("tiny");
  const std::string prefix = "model.language_model.layers.0.";
  const auto open_error = [](const std::string& dir) -> std::string {
    try {
      Gemma4Checkpoint::open(dir);
    } catch (const Error& e) {
      return e.what();
    }
    return "(opened)";
  };
  for (const char* tensor : {"input_layernorm.weight", "layer_scalar"}) {
    test::TempDir dir;
    test::copy_folder_files(original, dir.path());
    test::overwrite_tensor_start(dir.path(), prefix + tensor, "\x80\x7f");  // bf16 +Inf
    EXPECT_THAT(open_error(dir.path()), ::testing::HasSubstr(prefix + std::string(tensor) + "' holds a non-finite value"));
  }
  test::TempDir quantized;
  quantize_checkpoint(original, quantized.path(), WeightFormat::Q4, false);
  test::overwrite_tensor_start(quantized.path(), prefix + "self_attn.q_proj.weight_scale", std::string("\x00\x00\x00\x7e", 4));
  EXPECT_THAT(open_error(quantized.path()),
              ::testing::HasSubstr(prefix + "self_attn.q_proj.weight_scale' holds a non-finite scale (f16 0x7e00) at row 0, block 1"));

  // Matrices copied into memory (resident, the default) are checked as they are read; a NaN in a query
  // weight otherwise goes unnoticed (the attention's exp clamps it away) and the tokens change.
  test::TempDir query;
  test::copy_folder_files(original, query.path());
  test::overwrite_tensor_start(query.path(), prefix + "self_attn.q_proj.weight", std::string("\x00\x00\xc0\x7f", 4));
  const auto refused = test::run(test::shell_quote(test::tandem_binary()) + " generate --ids 2,5,6 --max-tokens 2 --model " +
                                 test::shell_quote(query.path()));
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_THAT(refused.err, ::testing::HasSubstr(prefix + "self_attn.q_proj.weight' holds a non-finite value (Inf or NaN) "
                                                "at row 0, column 1"));

  test::TempDir matrix;
  test::copy_folder_files(original, matrix.path());
  // Token 0's embedding row: the prompt below carries the NaN into the residual stream. Mapped weights
  // are not scanned (that would read the whole checkpoint at start-up); the step's check stops it.
  test::overwrite_tensor_start(matrix.path(), "model.language_model.embed_tokens.weight", "\xc0\x7f");
  const std::string generate = test::shell_quote(test::tandem_binary()) + " generate --ids 2,0,6 --max-tokens 2 --model " +
                               test::shell_quote(matrix.path());
  const auto resident = test::run(generate);
  EXPECT_EQ(resident.exit_code, 1) << resident.out;
  EXPECT_THAT(resident.err, ::testing::HasSubstr("embed_tokens.weight' holds a non-finite value (Inf or NaN) at row 0, column 0"));
  const auto generated = test::run(generate + " --weights mapped");
  EXPECT_EQ(generated.exit_code, 1) << generated.out;
  EXPECT_THAT(generated.err, ::testing::HasSubstr("non-finite value (NaN or Inf) in its final hidden state"));

  test::TempDir config;
  test::copy_folder_files(original, config.path());
  nlohmann::json c = nlohmann::json::parse(test::read_file(config.file("config.json")));
  (c.contains("text_config") ? c["text_config"] : c)["rms_norm_eps"] = -1;
  test::write_file(config.file("config.json"), c.dump());
  EXPECT_THAT(open_error(config.path()), ::testing::HasSubstr("rms_norm_eps must be a small positive number"));
}

TEST(Checkpoint, WarmPleTableReadsTheWholeTableIntoThePageCache) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  for (const auto& file : ckpt->files.files()) {  // best effort: start from a cold cache
    const int fd = ::open(file->mapping().path().c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  const WeightMatrix& table = ckpt->weights.ple_table;
  ASSERT_FALSE(table.empty());
  ASSERT_TRUE(ckpt->warm_ple_table());
  const auto [in, total] = resident_pages(table.data, size_t(table.rows) * size_t(table.row_stride));
  EXPECT_EQ(in, total);
}

TEST(Checkpoint, FindsTheMappingThatHoldsATensor) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  const std::vector<uint8_t> elsewhere(4096);
  EXPECT_EQ(ckpt->files.mapping_of(elsewhere.data()), nullptr);
  const WeightMatrix& embed = ckpt->weights.embed;
  const MappedFile* m = ckpt->files.mapping_of(embed.data);
  ASSERT_NE(m, nullptr);
  EXPECT_TRUE(embed.data >= m->data() && embed.data + embed.row_stride * embed.rows <= m->data() + m->size());
}

// The memory the bench's probe reads (ModelWeights::streamed_ranges): every byte one decode step
// streams and nothing else, whether the matrices are mapped from the files (plain rows, scales
// apart) or resident (row groups holding their scales), in bf16 and Q8.
TEST(Checkpoint, StreamedRangesAreTheBytesADecodeStepStreams) {
  test::TempDir q8;
  quantize_checkpoint(test::synth_checkpoint("tiny"), q8.path(), WeightFormat::Q8, false);
  ThreadPool pool(2);
  for (const std::string& dir : {test::synth_checkpoint("tiny"), q8.path()})
    for (WeightResidency residency : {WeightResidency::Mapped, WeightResidency::Resident}) {
      auto ckpt = Gemma4Checkpoint::open(dir, ShardPlan{}, residency, pool, false,
                                         residency == WeightResidency::Resident ? cpu::preferred_layout : nullptr);
      const ModelWeights& w = ckpt->weights;
      const std::vector<ByteRange> ranges = w.streamed_ranges();
      size_t total = 0;
      for (const ByteRange& r : ranges) total += r.bytes;
      const size_t ple_row = w.ple_table.streamed_bytes() / size_t(w.ple_table.rows);
      EXPECT_EQ(total, w.streamed_bytes_per_token() - ple_row) << dir;
      // Each matrix's first and last streamed byte lie in the merged ranges; the PLE table does not.
      const std::vector<ByteRange> merged = merge_ranges(ranges);
      auto covered = [&](const uint8_t* p) {
        return std::any_of(merged.begin(), merged.end(),
                           [&](const ByteRange& r) { return p >= r.data && p < r.data + r.bytes; });
      };
      for (const WeightMatrix* m : {&w.lm_head, &w.layers[0].q_proj, &w.layers.back().down_proj}) {
        const size_t rows = size_t(m->rows);
        EXPECT_TRUE(covered(m->data)) << dir;
        if (m->layout == WeightLayout::Interleaved) {  // codes and scales of each row group together
          EXPECT_TRUE(covered(m->data + rows * size_t(m->row_stride + m->scale_stride) - 1)) << dir;
          continue;
        }
        EXPECT_TRUE(covered(m->data + (rows - 1) * size_t(m->row_stride) + size_t(row_bytes(m->format, m->cols)) - 1))
            << dir;
        if (m->scales) {
          EXPECT_TRUE(covered(m->scales)) << dir;
          EXPECT_TRUE(covered(m->scales + (rows - 1) * size_t(m->scale_stride) +
                              size_t(scale_row_bytes(m->format, m->cols)) - 1))
              << dir;
        }
      }
      EXPECT_FALSE(covered(w.ple_table.data)) << dir;
    }
}

}  // namespace
}  // namespace tandem
