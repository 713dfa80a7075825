// All-reduce latency and bandwidth between tensor-parallel ranks, for docs/parallel.md:
//   mpirun -np 2 build/bench/allreduce_bench            (shared memory)
//   mpirun -np 2 --mca btl self,tcp --mca btl_tcp_if_include lo build/bench/allreduce_bench
// Prints one line per message size: median microseconds per all-reduce and the bus bandwidth.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "parallel/mpi_communicator.h"

int main(int argc, char** argv) {
  auto comm = tandem::make_world_communicator(&argc, &argv);
  if (comm->rank() == 0) fmt::print("{:>12} {:>12} {:>14}\n", "floats", "median_us", "bus_GB_s");
  for (size_t n : {size_t(2560), size_t(2560) * 8, size_t(2560) * 64, size_t(2560) * 512, size_t(1) << 22}) {
    std::vector<float> data(n, 1.0f);
    const int reps = n > (1u << 20) ? 20 : 200;
    std::vector<double> times;
    for (int i = 0; i < reps + 5; ++i) {
      comm->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      comm->all_reduce_sum(data.data(), n);
      const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (i >= 5) times.push_back(us);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const int p = comm->size();
    // Bus bandwidth as NCCL reports it: 2(p-1)/p of the buffer crosses each link per all-reduce.
    const double bus = double(n) * 4 * 2.0 * (p - 1) / p / (median * 1e-6) / 1e9;
    if (comm->rank() == 0) fmt::print("{:>12} {:>12.1f} {:>14.2f}\n", n, median, bus);
  }
  return 0;
}
