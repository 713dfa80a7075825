#pragma once
// Wraps a communicator and adds up the wall time spent in its collectives, so benchmarks can
// report communication cost per token.
#include <chrono>
#include <cstdlib>

#include "parallel/communicator.h"

namespace tandem {

class TimedCommunicator final : public Communicator {
 public:
  explicit TimedCommunicator(Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce_sum(float* data, size_t count) override { timed([&] { inner_.all_reduce_sum(data, count); }); }
  void all_gather(const void* in, void* out, size_t count) override { timed([&] { inner_.all_gather(in, out, count); }); }
  void broadcast(void* data, size_t bytes, int root) override { timed([&] { inner_.broadcast(data, bytes, root); }); }
  void barrier() override { timed([&] { inner_.barrier(); }); }
  [[noreturn]] void abort_job(int code) override {
    inner_.abort_job(code);
    std::abort();
  }

  double seconds() const { return seconds_; }
  uint64_t calls() const { return calls_; }
  void reset() {
    seconds_ = 0;
    calls_ = 0;
  }

 private:
  template <typename F>
  void timed(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++calls_;
  }
  Communicator& inner_;
  double seconds_ = 0;
  uint64_t calls_ = 0;
};

}  // namespace tandem
