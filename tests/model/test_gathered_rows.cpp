// GatheredRows: PLE table rows read with pread hold exactly what the mapping holds, in the order
// asked, in every format a checkpoint may store the table in; anything it cannot read falls back
// to the table itself.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "model/checkpoint.h"
#include "model/gathered_rows.h"
#include "model/quantize_checkpoint.h"
#include "support/test_support.h"

namespace tandem {
namespace {

std::vector<float> row_of(const WeightMatrix& m, int64_t r) {
  std::vector<float> out(size_t(m.cols));
  m.row_to_float(r, out.data());
  return out;
}

void expect_gathers_like_the_mapping(const Gemma4Checkpoint& ckpt) {
  const WeightMatrix& table = ckpt.weights.ple_table;
  ASSERT_FALSE(table.empty());
  ASSERT_NE(ckpt.weights.ple_table_file, nullptr);
  GatheredRows gathered(table, ckpt.weights.ple_table_file);
  const int32_t last = int32_t(table.rows - 1);
  for (const std::vector<int32_t>& ids : {std::vector<int32_t>{7}, std::vector<int32_t>{last, 0, 7, 7, 3}}) {
    const GatheredRows::View view = gathered.gather(ids.data(), int64_t(ids.size()));
    EXPECT_NE(view.matrix, &table) << "rows were read through the mapping";
    for (size_t i = 0; i < ids.size(); ++i)
      EXPECT_EQ(row_of(*view.matrix, view.ids[i]), row_of(table, ids[i])) << "row " << ids[i];
  }
}

TEST(GatheredRows, ReadRowsEqualTheMappedOnes) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  expect_gathers_like_the_mapping(*ckpt);
}

TEST(GatheredRows, ReadRowsEqualTheMappedOnesInQuantizedCheckpoints) {
  const std::string original = test::synth_checkpoint("tiny");
  for (WeightFormat type : {WeightFormat::Q8, WeightFormat::Q4}) {
    test::TempDir dir;
    quantize_checkpoint(original, dir.path(), type, false);
    auto ckpt = Gemma4Checkpoint::open(dir.path());
    SCOPED_TRACE(std::string(weight_format_name(ckpt->weights.ple_table.format)));
    expect_gathers_like_the_mapping(*ckpt);
  }
}

TEST(GatheredRows, FallsBackToTheTableForIdsOutsideItOrWithoutAFile) {
  auto ckpt = Gemma4Checkpoint::open(test::golden_tiny_checkpoint());
  const WeightMatrix& table = ckpt->weights.ple_table;
  const std::vector<int32_t> outside{1, int32_t(table.rows)};
  GatheredRows gathered(table, ckpt->weights.ple_table_file);
  GatheredRows::View view = gathered.gather(outside.data(), 2);
  EXPECT_EQ(view.matrix, &table);
  EXPECT_EQ(view.ids, outside.data());

  GatheredRows unmapped(table, nullptr);
  view = unmapped.gather(outside.data(), 1);
  EXPECT_EQ(view.matrix, &table);
  EXPECT_EQ(row_of(*view.matrix, view.ids[0]), row_of(table, 1));
}

}  // namespace
}  // namespace tandem
