#include "server/route_context.h"

#include "server/api_error.h"

namespace tandem::server {

void ActiveGenerations::enter() {
  std::lock_guard lock(mutex_);
  if (draining_) throw ApiError(503, "server_error", "the server is shutting down", {}, "shutting_down");
  ++count_;
}

void ActiveGenerations::leave() {
  {
    std::lock_guard lock(mutex_);
    --count_;
  }
  changed_.notify_all();
}

void ActiveGenerations::start_draining() {
  std::lock_guard lock(mutex_);
  draining_ = true;
}

bool ActiveGenerations::draining() const {
  std::lock_guard lock(mutex_);
  return draining_;
}

bool ActiveGenerations::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  changed_.wait_until(lock, deadline, [&] { return count_ == 0 || woken_; });
  woken_ = false;
  return count_ == 0;
}

void ActiveGenerations::wake() {
  {
    std::lock_guard lock(mutex_);
    woken_ = true;
  }
  changed_.notify_all();
}

int ActiveGenerations::count() const {
  std::lock_guard lock(mutex_);
  return count_;
}

}  // namespace tandem::server
