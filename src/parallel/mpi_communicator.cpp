#include "parallel/mpi_communicator.h"

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/error.h"

#if TANDEM_WITH_MPI
#include <mpi.h>
#endif

namespace tandem {

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"})
    if (std::getenv(var)) return true;
  return false;
}

int local_rank_count() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  return 1;
}

#if TANDEM_WITH_MPI

namespace {

void check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  std::fprintf(stderr, "tandem: %s failed: %.*s\n", what, len, text);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int* argc, char*** argv) {
    int provided = 0;
    // The engine thread (not main) drives collectives on rank 0: calls are serialized, not funneled.
    check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) {
      std::fprintf(stderr, "tandem: the MPI library does not support MPI_THREAD_SERIALIZED\n");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCommunicator() override { MPI_Finalize(); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, size_t count) override {
    for (size_t done = 0; done < count; done += kMaxCount) {
      const int n = int(std::min(kMaxCount, count - done));
      check(MPI_Allreduce(MPI_IN_PLACE, data + done, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    }
  }

  void all_gather(const void* in, void* out, size_t count) override {
    if (count > kMaxCount) fail("all_gather of {} bytes per rank is too large", count);
    check(MPI_Allgather(in, int(count), MPI_BYTE, out, int(count), MPI_BYTE, MPI_COMM_WORLD), "MPI_Allgather");
  }

  void broadcast(void* data, size_t bytes, int root) override {
    for (size_t done = 0; done < bytes; done += kMaxCount) {
      const int n = int(std::min(kMaxCount, bytes - done));
      check(MPI_Bcast(static_cast<char*>(data) + done, n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  // MPI_Bcast busy-polls (OpenMPI): an idle server's followers each held a core at 100%. A
  // nonblocking broadcast tested in a loop spins for the first millisecond (a busy server's next step
  // comes sooner, and adds no latency), then sleeps 200 us between tests, and 1 ms after 100 ms idle
  // (~1% of a core).
  void broadcast_idle_wait(void* data, size_t bytes, int root) override {
    MPI_Request request;
    check(MPI_Ibcast(data, int(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &request), "MPI_Ibcast");
    const auto start = std::chrono::steady_clock::now();
    for (int done = 0;;) {
      check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) return;
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited > std::chrono::milliseconds(100)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      else if (waited > std::chrono::milliseconds(1)) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  [[noreturn]] void abort_job(int code) override {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::exit(code);
  }

 private:
  static constexpr size_t kMaxCount = size_t(INT_MAX) / 2;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_world_communicator(int* argc, char*** argv) {
  if (!launched_by_mpi()) return std::make_unique<LocalCommunicator>();
  return std::make_unique<MpiCommunicator>(argc, argv);
}

#else

std::unique_ptr<Communicator> make_world_communicator(int*, char***) {
  if (launched_by_mpi()) fail("this tandem was built without MPI (TANDEM_WITH_MPI=OFF) but was started by mpirun");
  return std::make_unique<LocalCommunicator>();
}

#endif

}  // namespace tandem
