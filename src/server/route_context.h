#pragma once
// What every route handler gets: the served model, the metrics, and the count of generations in
// flight (so that a graceful shutdown can wait for them).
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "server/metrics.h"
#include "server/served_model.h"

namespace tandem::server {

class ActiveGenerations {
 public:
  void enter();  // throws ApiError 503 once draining has begun
  void leave();
  void start_draining();
  bool draining() const;
  // Waits until none is left (true), `deadline` passes or wake() is called (false unless idle).
  bool wait_idle(std::chrono::steady_clock::time_point deadline);
  void wake();
  int count() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  int count_ = 0;
  bool draining_ = false;
  bool woken_ = false;
};

struct RouteContext {
  const ServedModel& model;
  ServerMetrics& metrics;
  ActiveGenerations& active;
};

}  // namespace tandem::server
