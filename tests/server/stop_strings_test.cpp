// Stop strings over text that arrives in pieces: nothing of a stop string is ever released.
#include <gtest/gtest.h>

#include "server/stop_strings.h"

namespace tandem::server {
namespace {

// Pushes `pieces` and returns everything released (flushing at the end unless stopped).
std::string run(StopStringMatcher& m, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += m.push(p);
  return out + m.flush();
}

TEST(StopStrings, NoStopsPassEverythingThrough) {
  StopStringMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, CutsBeforeTheStopString) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(run(m, {"hello E", "N", "D and more"}), "hello ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "END");
  EXPECT_EQ(m.push("later"), "");
}

TEST(StopStrings, HoldsBackOnlyWhatMayStartAStopString) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("abcE"), "abc");
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("x"), "ENx");  // not a stop after all
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStrings, ReleasesAHeldTailAtTheEnd) {
  StopStringMatcher m({"END"});
  EXPECT_EQ(m.push("abcEN"), "abc");
  EXPECT_EQ(m.flush(), "EN");
}

TEST(StopStrings, TheEarliestOfSeveralWins) {
  StopStringMatcher m({"world", "lo w"});
  EXPECT_EQ(run(m, {"hel", "lo wor", "ld"}), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopStrings, StopAtTheVeryStartGivesNothing) {
  StopStringMatcher m({"\n\n"});
  EXPECT_EQ(run(m, {"\n", "\nrest"}), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopStrings, MultiByteStopStrings) {
  StopStringMatcher m({"日本"});
  EXPECT_EQ(run(m, {"こんにちは日", "本語"}), "こんにちは");
}

TEST(StopStrings, EveryWayOfSplittingGivesTheSameResult) {
  const std::string text = "the quick brown fox jumps over the lazy dog";
  for (const std::string& stop : std::vector<std::string>{"fox", "dog", "the", "zz", "lazy dog!"}) {
    const size_t at = text.find(stop);
    const std::string expected = at == std::string::npos ? text : text.substr(0, at);
    for (size_t cut = 0; cut <= text.size(); ++cut) {
      for (size_t cut2 = cut; cut2 <= text.size(); cut2 += 3) {
        StopStringMatcher m({stop});
        EXPECT_EQ(run(m, {text.substr(0, cut), text.substr(cut, cut2 - cut), text.substr(cut2)}), expected)
            << stop << " split at " << cut << "," << cut2;
      }
    }
  }
}

}  // namespace
}  // namespace tandem::server
