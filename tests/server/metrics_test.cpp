// The Prometheus exposition: vLLM's metric names, the model_name label, the engine's gauges.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/metrics.h"

namespace tandem::server {
namespace {

using ::testing::HasSubstr;

TEST(Metrics, ExposesVllmNamesWithTheModelLabel) {
  ServerMetrics metrics("gemma");
  metrics.observe_time_to_first_token(0.05);
  metrics.observe_inter_token_latency(0.02);
  metrics.observe_request_end(1.5, "length", 10, 20);
  metrics.observe_request_end(0.5, "abort", 3, 1);
  EngineStats stats;
  stats.running = 2;
  stats.waiting = 1;
  stats.kv_usage = 0.25;
  stats.prompt_tokens = 13;
  stats.generation_tokens = 21;
  stats.prefix_cache_queries = 40;
  stats.prefix_cache_hits = 29;
  const std::string text = metrics.render(stats);
  for (const char* line : {
           "vllm:num_requests_running{model_name=\"gemma\"} 2",
           "vllm:num_requests_waiting{model_name=\"gemma\"} 1",
           "vllm:kv_cache_usage_perc{model_name=\"gemma\"} 0.25",
           "vllm:gpu_cache_usage_perc{model_name=\"gemma\"} 0.25",
           "vllm:prompt_tokens_total{model_name=\"gemma\"} 13",
           "vllm:generation_tokens_total{model_name=\"gemma\"} 21",
           "vllm:prefix_cache_queries_total{model_name=\"gemma\"} 40",
           "vllm:prefix_cache_hits_total{model_name=\"gemma\"} 29",
           "vllm:request_success_total{finished_reason=\"length\",model_name=\"gemma\"} 1",
           "vllm:request_success_total{finished_reason=\"abort\",model_name=\"gemma\"} 1",
           "vllm:request_success_total{finished_reason=\"stop\",model_name=\"gemma\"} 0",
           "vllm:time_to_first_token_seconds_count{model_name=\"gemma\"} 1",
           "vllm:inter_token_latency_seconds_count{model_name=\"gemma\"} 1",
           "vllm:time_per_output_token_seconds_count{model_name=\"gemma\"} 1",
           "vllm:e2e_request_latency_seconds_count{model_name=\"gemma\"} 2",
           "# TYPE vllm:time_to_first_token_seconds histogram",
       })
    EXPECT_THAT(text, HasSubstr(line));

  // Counters follow the engine's totals across scrapes.
  stats.prompt_tokens = 20;
  EXPECT_THAT(metrics.render(stats), HasSubstr("vllm:prompt_tokens_total{model_name=\"gemma\"} 20"));
}

}  // namespace
}  // namespace tandem::server
