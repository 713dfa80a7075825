#pragma once
// How many CPUs this process may actually run on, for the default thread count. A container's
// cpuset or `taskset` narrows the affinity mask, and a CPU quota (docker --cpus, Kubernetes limits)
// caps the time, yet std::thread::hardware_concurrency() counts every online CPU of the host. The
// thread pool's workers spin between jobs, so one thread more than the CPUs there are took E4B q4
// decode from 6.45 to 3.09 tok/s (`taskset -c 0`, two threads against one).
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

// The CPUs of the affinity mask, capped by the cgroup's CPU quota (whole CPUs, rounded down), at
// least 1.
int usable_cpus();

// Whole CPUs a cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none) allows, rounded down
// and at least 1; nullopt for no limit or text that is not a limit.
std::optional<int> cpus_of_cpu_max(std::string_view cpu_max);
// The same from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (a quota of -1: no limit).
std::optional<int> cpus_of_cfs_quota(int64_t quota_us, int64_t period_us);

}  // namespace tandem
