// Tokenizer throughput: loading tokenizer.json, encoding and decoding a corpus.
//
//   TANDEM_TOKENIZER=path/tokenizer.json TANDEM_CORPUS=corpus.json build/bench/tokenizer_bench
//
// The corpus is a JSON array of strings (tests/js/make_corpus.mjs writes one). bench/tokenizer_bench.sh
// runs this and the peer @huggingface/tokenizers on the same corpus and prints both.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/tokenizer.h"

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

struct Inputs {
  std::string tokenizer_path = env("TANDEM_TOKENIZER");
  std::vector<std::string> docs;
  size_t bytes = 0;
  Inputs() {
    if (const std::string corpus = env("TANDEM_CORPUS"); !corpus.empty()) {
      std::ifstream in(corpus, std::ios::binary);
      std::stringstream text;
      text << in.rdbuf();
      docs = nlohmann::json::parse(text.str()).get<std::vector<std::string>>();
      for (const std::string& d : docs) bytes += d.size();
    }
  }
};

const Inputs& inputs() {
  static const Inputs in;
  return in;
}

const tandem::Tokenizer& tokenizer() {
  static const tandem::Tokenizer t = tandem::Tokenizer::from_file(inputs().tokenizer_path);
  return t;
}

bool ready(benchmark::State& state) {
  if (inputs().tokenizer_path.empty() || inputs().docs.empty()) {
    state.SkipWithError("set TANDEM_TOKENIZER and TANDEM_CORPUS (see bench/tokenizer_bench.sh)");
    return false;
  }
  return true;
}

void BM_LoadTokenizer(benchmark::State& state) {
  if (inputs().tokenizer_path.empty()) return state.SkipWithError("set TANDEM_TOKENIZER");
  for (auto _ : state) benchmark::DoNotOptimize(tandem::Tokenizer::from_file(inputs().tokenizer_path));
}
BENCHMARK(BM_LoadTokenizer)->Unit(benchmark::kMillisecond)->Iterations(3);

// Bytes/s from CPU time on one thread; with two threads (each encoding the whole corpus on one
// shared tokenizer) from wall time, per thread.
void BM_EncodeCorpus(benchmark::State& state) {
  if (!ready(state)) return;
  const tandem::Tokenizer& t = tokenizer();
  size_t tokens = 0;
  for (auto _ : state)
    for (const std::string& doc : inputs().docs) tokens += t.encode(doc, false).size();
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * inputs().bytes));
  state.counters["tokens"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_EncodeCorpus)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeCorpus)->Unit(benchmark::kMillisecond)->MinTime(2.0)->UseRealTime()->Threads(2);

void BM_DecodeCorpus(benchmark::State& state) {
  if (!ready(state)) return;
  const tandem::Tokenizer& t = tokenizer();
  std::vector<std::vector<int32_t>> ids;
  for (const std::string& doc : inputs().docs) ids.push_back(t.encode(doc, false));
  for (auto _ : state)
    for (const auto& seq : ids) benchmark::DoNotOptimize(t.decode(seq));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * inputs().bytes));
}
BENCHMARK(BM_DecodeCorpus)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
