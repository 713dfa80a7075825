#pragma once
// Prometheus metrics under vLLM's names, so existing dashboards work unchanged:
//   histograms vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds (and its older
//   name vllm:time_per_output_token_seconds), vllm:e2e_request_latency_seconds,
//   vllm:request_prompt_tokens, vllm:request_generation_tokens;
//   gauges vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc (and
//   vllm:gpu_cache_usage_perc), counters vllm:prompt_tokens_total, vllm:generation_tokens_total,
//   vllm:num_preemptions_total, vllm:prefix_cache_queries_total and vllm:prefix_cache_hits_total
//   (prompt tokens looked up in, and found among, the prefixes ended requests left),
//   vllm:request_success_total{finished_reason}.
// Every series carries the label model_name. Latencies are observed as events happen; the engine's
// gauges and totals are read when /metrics is scraped.
#include <memory>
#include <mutex>
#include <string>

#include "runtime/engine.h"

namespace prometheus {
class Registry;
class Histogram;
class Gauge;
class Counter;
template <typename T>
class Family;
}  // namespace prometheus

namespace tandem::server {

class ServerMetrics {
 public:
  explicit ServerMetrics(const std::string& model_name);
  ~ServerMetrics();
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Thread-safe; cheap enough for the engine thread.
  void observe_time_to_first_token(double seconds);
  void observe_inter_token_latency(double seconds);
  // `finished_reason`: stop, length or abort (vLLM's label values).
  void observe_request_end(double e2e_seconds, const std::string& finished_reason, int prompt_tokens,
                           int generation_tokens);

  // The Prometheus text exposition, with the engine's current gauges and totals.
  std::string render(const EngineStats& stats);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::string model_name_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* tpot_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* prompt_tokens_hist_;
  prometheus::Histogram* generation_tokens_hist_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_usage_;
  prometheus::Gauge* gpu_cache_usage_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* generation_tokens_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* prefix_cache_queries_;
  prometheus::Counter* prefix_cache_hits_;
  prometheus::Family<prometheus::Counter>* success_;
  std::mutex render_mutex_;  // counters follow the engine's totals by increments between scrapes
};

}  // namespace tandem::server
