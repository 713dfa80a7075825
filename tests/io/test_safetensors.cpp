// The safetensors reader: valid files, and every malformed case refused with a message naming the
// file and the tensor.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace tandem {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Writes [8-byte length][header][data] exactly as given, so tests can corrupt any part.
std::string write_raw(const test::TempDir& dir, const std::string& name, const std::string& header,
                      const std::string& data, int64_t declared_length = -1) {
  std::string bytes(8, '\0');
  const uint64_t len = declared_length < 0 ? header.size() : uint64_t(declared_length);
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char((len >> (8 * i)) & 0xff);
  bytes += header + data;
  const std::string path = dir.file(name);
  test::write_file(path, bytes);
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Safetensors, ReadsTensorsWithDtypeShapeAndData) {
  test::TempDir dir;
  const float values[3] = {1.5f, -2.0f, 3.25f};
  std::string data(reinterpret_cast<const char*>(values), sizeof values);
  data += std::string("\x80\x3f\x00\x40", 4);  // bf16 1.0, 2.0
  const std::string path = write_raw(
      dir, "a.safetensors",
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[12,16]}})",
      data);
  SafetensorsFile file(path);
  ASSERT_EQ(file.tensors().size(), 2u);
  EXPECT_EQ(file.metadata().at("format"), "pt");
  const TensorInfo* w = file.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dtype, DType::F32);
  EXPECT_EQ(w->shape, (std::vector<int64_t>{3}));
  float back[3];
  std::memcpy(back, w->data, 12);
  EXPECT_EQ(back[2], 3.25f);
  const TensorInfo* b = file.find("b");
  ASSERT_NE(b, nullptr);
  uint16_t bits[2];
  std::memcpy(bits, b->data, 4);
  EXPECT_EQ(bf16_to_f32(bits[0]), 1.0f);
  EXPECT_EQ(bf16_to_f32(bits[1]), 2.0f);
  EXPECT_EQ(file.find("missing"), nullptr);
}

TEST(Safetensors, WriterOutputReadsBack) {
  test::TempDir dir;
  const std::string path = dir.file("w.safetensors");
  {
    SafetensorsWriter writer(path, {{"x", DType::F16, {2, 2}}, {"y", DType::I8, {3}}});
    const uint16_t x[4] = {f32_to_f16(1.0f), f32_to_f16(-0.5f), f32_to_f16(65504.0f), f32_to_f16(0.0f)};
    const int8_t y[3] = {-128, 0, 127};
    writer.write(x, sizeof x);
    writer.write(y, sizeof y);
    writer.finish();
  }
  SafetensorsFile file(path);
  const TensorInfo* x = file.find("x");
  ASSERT_NE(x, nullptr);
  EXPECT_EQ(x->dtype, DType::F16);
  uint16_t bits[4];
  std::memcpy(bits, x->data, 8);
  EXPECT_EQ(f16_to_f32(bits[1]), -0.5f);
  EXPECT_EQ(f16_to_f32(bits[2]), 65504.0f);
  EXPECT_EQ(int8_t(file.find("y")->data[0]), -128);
}

TEST(Safetensors, WriterRefusesShortOrLongData) {
  test::TempDir dir;
  SafetensorsWriter writer(dir.file("s.safetensors"), {{"x", DType::F32, {2}}});
  const float v = 1.0f;
  writer.write(&v, 4);
  EXPECT_THROW(writer.finish(), Error);
  SafetensorsWriter writer2(dir.file("t.safetensors"), {{"x", DType::F32, {1}}});
  const float two[2] = {1, 2};
  EXPECT_THROW(writer2.write(two, 8), Error);
}

TEST(Safetensors, TruncatedFile) {
  test::TempDir dir;
  const std::string path = dir.file("t.safetensors");
  test::write_file(path, "abc");
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), AllOf(HasSubstr(path), HasSubstr("truncated")));
}

TEST(Safetensors, HeaderLengthPastTheEnd) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "h.safetensors", "{}", "", 1000);
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), AllOf(HasSubstr(path), HasSubstr("past the end")));
}

TEST(Safetensors, HeaderNotJson) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "j.safetensors", "{not json", "");
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), AllOf(HasSubstr(path), HasSubstr("not valid JSON")));
}

TEST(Safetensors, TensorDataTruncated) {
  test::TempDir dir;  // the header promises 16 bytes, the file holds 8
  const std::string path = write_raw(dir, "d.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                     std::string(8, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }),
              AllOf(HasSubstr(path), HasSubstr("'w'"), HasSubstr("out of range")));
}

TEST(Safetensors, OffsetsReversed) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "r.safetensors", R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})",
                                     std::string(8, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), AllOf(HasSubstr("'w'"), HasSubstr("out of range")));
}

TEST(Safetensors, OverlappingTensors) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "o.safetensors",
                                     R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                     std::string(12, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }),
              AllOf(HasSubstr(path), HasSubstr("'a'"), HasSubstr("'b'"), HasSubstr("overlap")));
}

TEST(Safetensors, UnknownDtype) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "u.safetensors", R"({"w":{"dtype":"Q17","shape":[1],"data_offsets":[0,4]}})",
                                     std::string(4, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }),
              AllOf(HasSubstr(path), HasSubstr("'w'"), HasSubstr("unknown dtype")));
}

TEST(Safetensors, ShapeDisagreesWithByteRange) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "s.safetensors", R"({"w":{"dtype":"BF16","shape":[3,3],"data_offsets":[0,16]}})",
                                     std::string(16, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }),
              AllOf(HasSubstr("'w'"), HasSubstr("[3, 3]"), HasSubstr("needs 18 bytes")));
}

TEST(Safetensors, NegativeOrNonIntegerShape) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "n.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})",
                                     std::string(4, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), AllOf(HasSubstr("'w'"), HasSubstr("shape")));
}

// Shapes whose byte count passes 2^64: a 128-bit product wraps too ([2^64, 2^64] of F32 is 0 mod
// 2^128), and the message used to say "needs 0 bytes".
TEST(Safetensors, ShapeLargerThanAnyFile) {
  test::TempDir dir;
  for (const char* shape : {"[4294967296,4294967296]", "[18446744073709551615,2]",
                            "[18446744073709551616,18446744073709551616,4]", "[4611686018427388928,2]"}) {
    const std::string path =
        write_raw(dir, "big.safetensors",
                  std::string(R"({"w":{"dtype":"F32","shape":)") + shape + R"(,"data_offsets":[0,0]}})", "");
    EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), HasSubstr("'w': shape")) << shape;
  }
}

TEST(Safetensors, DuplicateTensorName) {
  test::TempDir dir;
  const std::string path = write_raw(dir, "dup.safetensors",
                                     R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                     R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                     std::string(8, '\0'));
  EXPECT_THAT(error_of([&] { SafetensorsFile f(path); }), AllOf(HasSubstr(path), HasSubstr("'w' appears twice")));
}

TEST(Safetensors, MissingFile) {
  EXPECT_THAT(error_of([] { SafetensorsFile f("/nonexistent/x.safetensors"); }),
              HasSubstr("/nonexistent/x.safetensors"));
}

TEST(CheckpointFiles, ShardedFolderWithIndex) {
  test::TempDir dir;
  write_raw(dir, "model-1.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  write_raw(dir, "model-2.safetensors", R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  test::write_file(dir.file("model.safetensors.index.json"),
                   R"({"metadata":{},"weight_map":{"a":"model-1.safetensors","b":"model-2.safetensors"}})");
  CheckpointFiles files(dir.path());
  EXPECT_EQ(files.files().size(), 2u);
  EXPECT_NE(files.find("a"), nullptr);
  EXPECT_NE(files.find("b"), nullptr);
  EXPECT_THAT(error_of([&] { files.get("c"); }), AllOf(HasSubstr("missing tensor 'c'"), HasSubstr(dir.path())));
}

TEST(CheckpointFiles, SingleFile) {
  test::TempDir dir;
  write_raw(dir, "model.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  CheckpointFiles files(dir.path());
  EXPECT_NE(files.find("a"), nullptr);
}

TEST(CheckpointFiles, DuplicateAcrossShards) {
  test::TempDir dir;
  write_raw(dir, "m1.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  write_raw(dir, "m2.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"m1.safetensors","x":"m2.safetensors"}})");
  EXPECT_THAT(error_of([&] { CheckpointFiles f(dir.path()); }),
              AllOf(HasSubstr("'a'"), HasSubstr("m1.safetensors"), HasSubstr("m2.safetensors")));
}

TEST(CheckpointFiles, MissingShard) {
  test::TempDir dir;
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"gone.safetensors"}})");
  EXPECT_THAT(error_of([&] { CheckpointFiles f(dir.path()); }), AllOf(HasSubstr("gone.safetensors"), HasSubstr("missing")));
}

TEST(CheckpointFiles, IndexListsTensorTheShardLacks) {
  test::TempDir dir;
  write_raw(dir, "m1.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(4, '\0'));
  test::write_file(dir.file("model.safetensors.index.json"), R"({"weight_map":{"a":"m1.safetensors","b":"m1.safetensors"}})");
  EXPECT_THAT(error_of([&] { CheckpointFiles f(dir.path()); }), AllOf(HasSubstr("'b'"), HasSubstr("m1.safetensors")));
}

TEST(CheckpointFiles, NoWeights) {
  test::TempDir dir;
  EXPECT_THAT(error_of([&] { CheckpointFiles f(dir.path()); }), HasSubstr("no model.safetensors"));
  EXPECT_THAT(error_of([&] { CheckpointFiles f(dir.file("nope")); }), HasSubstr("not a model folder"));
}

TEST(CheckpointFiles, CorruptIndex) {
  test::TempDir dir;
  test::write_file(dir.file("model.safetensors.index.json"), "{\"weight_map\": [");
  EXPECT_THAT(error_of([&] { CheckpointFiles f(dir.path()); }),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("not valid JSON")));
}

}  // namespace
}  // namespace tandem
