// Sampling costs per row of a Gemma-sized vocabulary (262144 logits, 1 MB), the row in cache, on two
// made-up rows: flat (normal logits, sd 3: tens of thousands of tokens within reach of a draw at
// temperature 1, the warpers' worst case) and peaked (sd 2, with 40 tokens 8-16 above the rest, as
// a chat model's rows mostly are):
//   Sample/greedy            the argmax a greedy request takes
//   Sample/greedy_logprobs   the same with log-probabilities and 5 top log-probabilities
//   Sample/temperature_1     plain sampling at temperature 1 (the OpenAI API's default)
//   Sample/top_k_40          temperature 1, top-k 40
//   Sample/top_p             temperature 0.8, top-p 0.95 (the warpers' lazy order)
// A batch step samples each of its rows once, on the engine's thread, after the LM head.
// Run: build/bench/sampler_bench
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "runtime/sampler.h"

namespace {

using namespace tandem;

std::vector<float> vocabulary_row(bool peaked) {
  std::vector<float> logits(262144);
  std::mt19937 rng(7);
  std::normal_distribution<float> value(-2.0f, peaked ? 2.0f : 3.0f);
  for (float& v : logits) v = value(rng);
  if (peaked)
    for (int i = 0; i < 40; ++i) logits[size_t(rng() % logits.size())] += 8.0f + float(i % 9);
  return logits;
}

void run_sampler(benchmark::State& state, SamplingParams params) {
  const std::vector<float> logits = vocabulary_row(state.range(0) != 0);
  Sampler sampler(params, {});
  for (auto _ : state) benchmark::DoNotOptimize(sampler.sample(logits).token);
  state.SetLabel(state.range(0) ? "peaked" : "flat");
  state.counters["GB/s"] =
      benchmark::Counter(double(logits.size() * sizeof(float)) * double(state.iterations()) / 1e9,
                         benchmark::Counter::kIsRate);
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

void BM_Greedy(benchmark::State& state) { run_sampler(state, greedy()); }

void BM_GreedyLogprobs(benchmark::State& state) {
  SamplingParams p = greedy();
  p.logprobs = true;
  p.top_logprobs = 5;
  run_sampler(state, p);
}

void BM_Temperature(benchmark::State& state) {
  SamplingParams p;
  p.seed = 1;
  run_sampler(state, p);
}

void BM_TopK(benchmark::State& state) {
  SamplingParams p;
  p.top_k = 40;
  p.seed = 1;
  run_sampler(state, p);
}

void BM_TopP(benchmark::State& state) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.seed = 1;
  run_sampler(state, p);
}

BENCHMARK(BM_Greedy)->Name("Sample/greedy")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_GreedyLogprobs)->Name("Sample/greedy_logprobs")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Temperature)->Name("Sample/temperature_1")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopK)->Name("Sample/top_k_40")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_TopP)->Name("Sample/top_p")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
