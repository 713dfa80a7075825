// JsonPrefix against nlohmann::json's parser (an independent reader of RFC 8259) on valid documents
// and on random mutations of them, and the sampler held to JSON on a small vocabulary of JSON pieces.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "runtime/json_output.h"
#include "runtime/sampler.h"

namespace tandem {
namespace {

// How far `text` gets: the bytes accepted before the first refused one, and whether it ends complete.
std::pair<size_t, bool> read(const std::string& text) {
  JsonPrefix p;
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.feed(static_cast<unsigned char>(text[i]))) return {i, false};
  return {text.size(), p.complete()};
}

// A JSON object, as nlohmann reads it (what json_object output must be).
bool is_json_object(const std::string& text) {
  if (!nlohmann::json::accept(text)) return false;
  return nlohmann::json::parse(text).is_object();
}

const std::vector<std::string> kValid = {
    R"({})",
    R"({ "a" : 1 })",
    R"({"a":[1,2,{"b":null}],"c":true,"d":false})",
    R"({"n":[-0,0.5,-12.25e+3,1E-7,3e2,0,10]})",
    R"({"s":"tab\t quote\" slash\/ back\\ \u00e9 \uD83D\uDE00 é 日本 🌊"})",
    "{\n  \"nested\": {\n    \"deep\": [[[], {}], [\"x\"]]\n  }\n}",
    R"({"":""})",
};

TEST(JsonPrefix, ReadsValidObjectsToTheEnd) {
  for (const std::string& doc : kValid) {
    ASSERT_TRUE(is_json_object(doc)) << doc;
    const auto [read_bytes, complete] = read(doc);
    EXPECT_EQ(read_bytes, doc.size()) << doc;
    EXPECT_TRUE(complete) << doc;
    // Every proper prefix is accepted and not complete.
    for (size_t n = 1; n < doc.size(); ++n) {
      const std::string prefix = doc.substr(0, n);
      EXPECT_EQ(read(prefix).first, n) << prefix;
      EXPECT_FALSE(read(prefix).second) << prefix;
    }
  }
}

TEST(JsonPrefix, RefusesAtTheFirstByteNoObjectCanHave) {
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"[1]", 0},        {"\"s\"", 0},       {"1", 0},           {"{'a':1}", 1},     {"{\"a\":01}", 6},
      {"{\"a\":1.}", 7}, {"{\"a\":-}", 6},   {"{\"a\":1,}", 7},  {"{\"a\" 1}", 5},   {"{\"a\":tru}", 8},
      {"{\"a\":nul }", 8}, {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\u12g\"}", 10}, {"{\"a\":[1 2]}", 8},
      {"{\"a\":1]", 6},  {"{}}", 2},         {"{} x", 2},        {"{\"a\":\"\x01\"}", 6},
      {"{\"a\":\"\xC3(\"}", 7}, {"{\"a\":\"\xFF\"}", 6}, {"{1:2}", 1},
      // UTF-8 that RFC 3629 leaves out: surrogates, overlong forms, past U+10FFFF.
      {"{\"a\":\"\xED\xA0\x80\"}", 7}, {"{\"a\":\"\xE0\x80\x80\"}", 7}, {"{\"a\":\"\xC0\x80\"}", 6},
      {"{\"a\":\"\xF0\x8F\x80\x80\"}", 7}, {"{\"a\":\"\xF4\x90\x80\x80\"}", 7},
  };
  for (const auto& [text, at] : cases) {
    EXPECT_FALSE(is_json_object(text)) << text;
    const auto [read_bytes, complete] = read(text);
    EXPECT_EQ(read_bytes, at) << text;
    EXPECT_FALSE(complete) << text;
  }
  // Nothing after the object, not even whitespace (the answer ends there).
  EXPECT_EQ(read("{}\n").first, 2u);
  // Numbers a double holds; no whitespace before the object; runs of it are held to 32 bytes;
  // nesting to 64 levels.
  EXPECT_TRUE(read("{\"a\":-12345678901234567890.5e-99}").second);
  EXPECT_EQ(read("{\"a\":123456789012345678901}").first, 25u);
  EXPECT_EQ(read("{\"a\":1e123}").first, 9u);
  EXPECT_EQ(read(" {}").first, 0u);
  EXPECT_EQ(read("{" + std::string(32, ' ') + "}").second, true);
  EXPECT_EQ(read("{" + std::string(33, ' ') + "}").first, 33u);
  std::string deep = "{\"a\":";
  for (int i = 0; i < 62; ++i) deep += "[";
  EXPECT_EQ(read(deep + "[").first, deep.size() + 1) << "64 levels";
  EXPECT_EQ(read(deep + "[[").first, deep.size() + 1) << "not 65";
}

// Random edits of valid objects, read by both: where nlohmann reads a JSON object (and no run of
// whitespace passes the limit), JsonPrefix reads it whole and complete; elsewhere it never ends complete.
TEST(JsonPrefix, AgreesWithAJsonParserOnRandomEdits) {
  const std::string alphabet = "{}[]:,\"0123456789-+.eEtrufalsn \nab\\";
  std::mt19937 rng(5);
  const std::regex past_limits(R"([eE][+-]?[0-9]{3}|[0-9]{21})");
  int objects = 0, others = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string doc = kValid[rng() % kValid.size()];
    for (int edits = 1 + int(rng() % 3); edits > 0; --edits) {
      const size_t at = rng() % (doc.size() + 1);
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0: doc.insert(doc.begin() + int64_t(at), c); break;
        case 1: if (at < doc.size()) doc[at] = c; break;
        default: if (at < doc.size()) doc.erase(at, 1); break;
      }
    }
    // (Whitespace runs stay far below the limit: at most the 2 + 3 of the seeds and the edits.)
    const bool object = is_json_object(doc) && doc.front() == '{' && doc.back() == '}';
    // Numbers past the limits that a double may still hold: refused by design, left out here.
    if (object && std::regex_search(doc, past_limits)) continue;
    const auto [read_bytes, complete] = read(doc);
    if (object) {
      ++objects;
      EXPECT_TRUE(read_bytes == doc.size() && complete) << doc;
    } else {
      ++others;
      EXPECT_FALSE(read_bytes == doc.size() && complete) << doc;
    }
  }
  EXPECT_GT(objects, 1000);
  EXPECT_GT(others, 1000);
}

// The sampler held to JSON, on a vocabulary of JSON pieces and junk, random logits and temperature 1:
// whatever it draws, the output is a JSON object once it draws the end token, which it draws only then.
TEST(JsonOutputConstraint, SamplingYieldsAJsonObject) {
  auto vocabulary = std::make_shared<TokenBytes>(std::vector<std::string>{
      "{", "}", "[", "]", "\"k\"", ":", ",", " ", "1", "-2.5", "true", "null", "x", "}}", "{\"", "\"", "a", "é", "",
      "\n", "0", "e5", "\":", "<bad>", "\xC3", "\xA9", "\\u00e9", "a\"b"});
  const int32_t end = 18;  // the special token (no bytes)
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> logit(-4.0f, 4.0f);
  int finished = 0;
  for (int run = 0; run < 300; ++run) {
    SamplingParams params;
    params.temperature = 1.0f;
    params.seed = uint64_t(run);
    params.json_vocabulary = vocabulary;
    params.json_end_tokens = {end};
    Sampler sampler(params, {});
    std::string out;
    bool ended = false;
    for (int step = 0; step < 60 && !ended; ++step) {
      std::vector<float> logits(vocabulary->bytes.size());
      for (float& l : logits) l = logit(rng);
      logits[size_t(end)] += 3.0f;  // the end token is likely whenever it is allowed
      const int32_t token = sampler.sample(logits).token;
      if (token == end) ended = true;
      else out += vocabulary->bytes[size_t(token)];
      ASSERT_EQ(read(out).first, out.size()) << "every draw keeps a JSON prefix: " << out;
    }
    if (ended) {
      ++finished;
      EXPECT_TRUE(is_json_object(out)) << out;
    }
  }
  EXPECT_GT(finished, 100);
}

// mask() allows exactly the tokens whose bytes JsonPrefix reads on from the output so far (the end
// token only once the object is closed), at every point of the valid objects: its shortcut for
// plain string content, its reading of shared prefixes once and its token-by-token reading included.
TEST(JsonOutputConstraint, MasksExactlyTheTokensThatKeepAJsonPrefix) {
  std::vector<std::string> pieces;
  for (int c = 0; c < 256; ++c) pieces.push_back(std::string(1, char(c)));  // as byte fallback gives
  pieces.push_back("");  // the end token
  const int32_t end = 256;
  std::mt19937 rng(3);
  const std::vector<std::string> parts = {"a", " b", "é", "日本", "\"", "\\", "\\u", "D83D", "\\uDE00", "}", ",",
                                          "1", ".5", "e", "-", "true", "null", "\n", "\t", "\xE6\x97", "🌊", ":"};
  // Enough pieces that the mask reads them in byte order (past 4096 unsettled) as well as one by one.
  for (int i = 0; i < 8000; ++i) {
    std::string p;
    for (int k = 1 + int(rng() % 3); k > 0; --k) p += parts[rng() % parts.size()];
    pieces.push_back(p);
  }
  auto vocabulary = std::make_shared<TokenBytes>(pieces);
  for (const std::string& doc : kValid) {
    JsonOutputConstraint constraint(vocabulary, {end});
    for (size_t n = 0; n <= doc.size(); ++n) {
      std::vector<float> logits(pieces.size(), 0.0f);
      constraint.mask(logits);
      JsonPrefix state;
      for (size_t i = 0; i < n; ++i) state.feed(static_cast<unsigned char>(doc[i]));
      for (size_t id = 0; id < pieces.size(); ++id) {
        JsonPrefix next = state;
        bool allowed = !pieces[id].empty();
        for (char c : pieces[id]) allowed = allowed && next.feed(static_cast<unsigned char>(c));
        if (int32_t(id) == end) allowed = state.complete();
        ASSERT_EQ(logits[id] == 0.0f, allowed) << "after '" << doc.substr(0, n) << "', token '" << pieces[id] << "'";
      }
      if (n < doc.size()) constraint.accept(static_cast<unsigned char>(doc[n]));
    }
  }
}

// Greedy: the best allowed token, not the best token.
TEST(JsonOutputConstraint, GreedyTakesTheBestAllowedToken) {
  auto vocabulary = std::make_shared<TokenBytes>(std::vector<std::string>{"hello", "{", "}", ""});
  SamplingParams params;
  params.temperature = 0.0f;
  params.json_vocabulary = vocabulary;
  params.json_end_tokens = {3};
  Sampler sampler(params, {});
  const std::vector<float> logits = {9.0f, 1.0f, 2.0f, 5.0f};
  EXPECT_EQ(sampler.sample(logits).token, 1) << "only '{' can start the object";
  EXPECT_EQ(sampler.sample(logits).token, 2);
  EXPECT_EQ(sampler.sample(logits).token, 3) << "closed: the end token";
}

}  // namespace
}  // namespace tandem
