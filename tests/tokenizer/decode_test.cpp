// Decoding and streaming decoding on a small tokenizer: byte tokens joined into UTF-8, invalid
// bytes as U+FFFD (one per maximal invalid part, like TextDecoder and Rust's from_utf8_lossy),
// "▁" as a space, special tokens kept or skipped, and ids out of range.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace tandem::test {
namespace {

using Ids = std::vector<int32_t>;

int32_t byte_id(unsigned char b) { return 4 + b; }

class Decode : public ::testing::Test {
 protected:
  Decode() : tokenizer_(make()) {}
  static Tokenizer make() {
    TinyTokenizerSpec spec;
    spec.tokens = {"▁", "a", "b", "▁ab", "▁▁"};
    return Tokenizer::from_json(tiny_tokenizer_json(spec), "tiny.json");
  }
  int32_t id(const std::string& token) const { return tokenizer_.token_to_id(token).value(); }
  std::string streamed(const Ids& ids, DecodeOptions options = {}) const {
    IncrementalDecoder decoder(tokenizer_, options);
    std::string text;
    for (int32_t i : ids) text += decoder.push(i);
    return text + decoder.flush();
  }
  Tokenizer tokenizer_;
};

TEST_F(Decode, WordStartMarksBecomeSpaces) {
  EXPECT_EQ(tokenizer_.decode(Ids{id("a"), id("▁ab"), id("▁▁"), id("b")}), "a ab  b");
}

TEST_F(Decode, ByteTokensJoinIntoUtf8) {
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xC3), byte_id(0xA9)}), "é");
  EXPECT_EQ(tokenizer_.decode(Ids{id("a"), byte_id(0xF0), byte_id(0x9F), byte_id(0x98), byte_id(0x80), id("b")}),
            "a😀b");
}

TEST_F(Decode, InvalidBytesBecomeOneReplacementCharacterPerMaximalPart) {
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xC3)}), "\uFFFD");
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xC3), id("a")}), "\uFFFDa");
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xE2), byte_id(0x82), id("a")}), "\uFFFDa");
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xFF), byte_id(0x41)}), "\uFFFDA");
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xED), byte_id(0xA0), byte_id(0x80)}), "\uFFFD\uFFFD\uFFFD");  // surrogate
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xE2), byte_id(0x82), byte_id(0xC3), byte_id(0xA9)}), "\uFFFDé");
}

TEST_F(Decode, SpecialTokensAreTextUnlessSkipped) {
  const Ids ids{2, id("a"), 1};
  EXPECT_EQ(tokenizer_.decode(ids), "<bos>a<eos>");
  EXPECT_EQ(tokenizer_.decode(ids, {.skip_special_tokens = true}), "a");
  // A skipped token does not interrupt a byte sequence.
  EXPECT_EQ(tokenizer_.decode(Ids{byte_id(0xC3), 2, byte_id(0xA9)}, {.skip_special_tokens = true}), "é");
}

TEST_F(Decode, IdsOutOfRangeAreErrorsNamingTheId) {
  for (int32_t bad : {-1, 265, 1000000}) {
    try {
      tokenizer_.decode(Ids{id("a"), bad});
      ADD_FAILURE() << "no error for id " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(tokenizer_.id_to_token(-1), Error);
  EXPECT_THROW(tokenizer_.id_to_token(tokenizer_.vocab_size()), Error);
  EXPECT_FALSE(tokenizer_.is_special(-5));
  IncrementalDecoder decoder(tokenizer_);
  EXPECT_THROW(decoder.push(99999), Error);
}

TEST_F(Decode, StreamingHoldsBackAnUnfinishedCharacterAndEmitsItWhole) {
  IncrementalDecoder decoder(tokenizer_);
  EXPECT_EQ(decoder.push(id("a")), "a");
  EXPECT_EQ(decoder.push(byte_id(0xF0)), "");
  EXPECT_EQ(decoder.push(byte_id(0x9F)), "");
  EXPECT_EQ(decoder.push(byte_id(0x98)), "");
  EXPECT_EQ(decoder.push(byte_id(0x80)), "😀");
  EXPECT_EQ(decoder.push(byte_id(0xC3)), "");
  EXPECT_EQ(decoder.push(byte_id(0xA9)), "é");
  EXPECT_EQ(decoder.push(id("▁ab")), " ab");
  EXPECT_EQ(decoder.flush(), "");
}

TEST_F(Decode, StreamingFlushesIncompleteBytesAsReplacementCharacters) {
  IncrementalDecoder decoder(tokenizer_);
  EXPECT_EQ(decoder.push(byte_id(0xF0)), "");
  EXPECT_EQ(decoder.push(byte_id(0x9F)), "");
  EXPECT_EQ(decoder.flush(), "\uFFFD");
  EXPECT_EQ(decoder.flush(), "");
  EXPECT_EQ(decoder.push(byte_id(0xE2)), "");
  EXPECT_EQ(decoder.push(id("a")), "\uFFFDa");  // a non-byte token ends the sequence
  EXPECT_EQ(decoder.push(byte_id(0xC3)), "");
  EXPECT_EQ(decoder.push(byte_id(0x41)), "\uFFFDA");  // an invalid continuation ends it too
}

TEST_F(Decode, StreamedTextAlwaysEqualsDecodeOfAllIds) {
  std::vector<Ids> cases = {
      {byte_id(0xE2), byte_id(0x82), byte_id(0xAC), id("a"), byte_id(0xE2)},
      {byte_id(0xF0), byte_id(0x9F), id("b"), byte_id(0x98), byte_id(0x80)},
      {2, byte_id(0xC3), 1, byte_id(0xA9), id("▁▁")},
      {byte_id(0xF4), byte_id(0x90), byte_id(0x80), byte_id(0x80)},
      {byte_id(0xC2), byte_id(0xC2), byte_id(0xA2)},
  };
  uint32_t state = 7;  // plus random byte soups
  for (int n = 0; n < 200; ++n) {
    Ids ids;
    for (int k = 0; k < 12; ++k) {
      state = state * 1664525u + 1013904223u;
      const uint32_t r = state >> 8;
      ids.push_back(r % 5 == 0 ? id("a") : r % 7 == 0 ? 2 : byte_id(static_cast<unsigned char>(0x7F + r % 0x81)));
    }
    cases.push_back(ids);
  }
  for (const Ids& ids : cases) {
    for (bool skip : {false, true}) {
      EXPECT_EQ(streamed(ids, {.skip_special_tokens = skip}), tokenizer_.decode(ids, {.skip_special_tokens = skip}));
    }
  }
}

}  // namespace
}  // namespace tandem::test
