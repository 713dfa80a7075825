#pragma once
// The communicator moves bytes between tensor-parallel ranks: all-reduce, all-gather, broadcast.
// It knows nothing about models. LocalCommunicator is the single-rank case; MPI (and later NCCL)
// implement the same interface.
#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place: every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  // Every rank contributes `count` bytes; `out` receives size() * count bytes in rank order.
  virtual void all_gather(const void* in, void* out, size_t count) = 0;
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // A broadcast the other ranks may wait on for long (a follower waiting for the next step of an idle
  // server): they poll and sleep between polls instead of spinning a core. Every rank must call this
  // one, not broadcast(), for the same message. At most 8 bytes.
  virtual void broadcast_idle_wait(void* data, size_t bytes, int root) { broadcast(data, bytes, root); }
  virtual void barrier() = 0;
  // Ends the whole job (all ranks) after a fatal error on this one.
  [[noreturn]] virtual void abort_job(int code) = 0;
};

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(float*, size_t) override {}
  void all_gather(const void* in, void* out, size_t count) override;
  void broadcast(void*, size_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort_job(int code) override;
};

}  // namespace tandem
