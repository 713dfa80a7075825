#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

namespace tandem::server {

namespace {

using prometheus::Histogram;

// vLLM's bucket boundaries, so histograms from both servers compare bucket by bucket.
const Histogram::BucketBoundaries kTtftBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,  0.75,
                                                  1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4,  0.5,
                                                 0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const Histogram::BucketBoundaries kE2eBuckets = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                                 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const Histogram::BucketBoundaries kTokenBuckets = {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000,
                                                   20000, 50000, 100000, 200000};

}  // namespace

ServerMetrics::ServerMetrics(const std::string& model_name)
    : registry_(std::make_shared<prometheus::Registry>()), model_name_(model_name) {
  const prometheus::Labels labels{{"model_name", model_name}};
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& buckets) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(*registry_).Add(labels, buckets);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(*registry_).Add(labels);
  };
  ttft_ = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", kTtftBuckets);
  itl_ = histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", kItlBuckets);
  tpot_ = histogram("vllm:time_per_output_token_seconds",
                    "Histogram of time per output token in seconds (same as inter_token_latency).", kItlBuckets);
  e2e_ = histogram("vllm:e2e_request_latency_seconds", "Histogram of end to end request latency in seconds.",
                   kE2eBuckets);
  prompt_tokens_hist_ = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", kTokenBuckets);
  generation_tokens_hist_ =
      histogram("vllm:request_generation_tokens", "Number of generation tokens processed.", kTokenBuckets);
  running_ = gauge("vllm:num_requests_running", "Number of requests in model execution batches.");
  waiting_ = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.");
  kv_usage_ = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.");
  gpu_cache_usage_ = gauge("vllm:gpu_cache_usage_perc", "KV-cache usage (older name of kv_cache_usage_perc).");
  prompt_tokens_ = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
  generation_tokens_ = counter("vllm:generation_tokens_total", "Number of generation tokens processed.");
  preemptions_ = counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.");
  prefix_cache_queries_ =
      counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.");
  prefix_cache_hits_ = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.");
  success_ = &prometheus::BuildCounter()
                  .Name("vllm:request_success_total")
                  .Help("Count of successfully processed requests.")
                  .Register(*registry_);
  for (const char* reason : {"stop", "length", "abort"})
    success_->Add({{"model_name", model_name}, {"finished_reason", reason}});
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::observe_time_to_first_token(double seconds) { ttft_->Observe(seconds); }

void ServerMetrics::observe_inter_token_latency(double seconds) {
  itl_->Observe(seconds);
  tpot_->Observe(seconds);
}

void ServerMetrics::observe_request_end(double e2e_seconds, const std::string& finished_reason, int prompt_tokens,
                                        int generation_tokens) {
  e2e_->Observe(e2e_seconds);
  prompt_tokens_hist_->Observe(prompt_tokens);
  generation_tokens_hist_->Observe(generation_tokens);
  success_->Add({{"model_name", model_name_}, {"finished_reason", finished_reason}}).Increment();
}

std::string ServerMetrics::render(const EngineStats& stats) {
  std::lock_guard lock(render_mutex_);
  running_->Set(stats.running);
  waiting_->Set(stats.waiting);
  kv_usage_->Set(stats.kv_usage);
  gpu_cache_usage_->Set(stats.kv_usage);
  auto follow = [](prometheus::Counter* counter, uint64_t total) {
    const double behind = double(total) - counter->Value();
    if (behind > 0) counter->Increment(behind);
  };
  follow(prompt_tokens_, stats.prompt_tokens);
  follow(generation_tokens_, stats.generation_tokens);
  follow(preemptions_, stats.preemptions);
  follow(prefix_cache_queries_, stats.prefix_cache_queries);
  follow(prefix_cache_hits_, stats.prefix_cache_hits);
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace tandem::server
