#pragma once
// What this process may use of the machine, for defaults (threads, the KV cache's budget). A
// container's cpuset or `taskset` narrows the affinity mask, a cgroup caps CPU time (docker --cpus,
// Kubernetes limits) and memory, yet std::thread::hardware_concurrency() and the physical page
// count describe the whole host. The thread pool's workers spin between jobs, so one thread more
// than the CPUs there are took E4B q4 decode from 6.45 to 3.09 tok/s (`taskset -c 0`, two threads
// against one); a KV budget sized from the host's memory outgrows a container's limit.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem {

// The CPUs of the affinity mask, capped by the cgroup's CPU quota (whole CPUs, rounded down), at
// least 1.
int usable_cpus();

// Physical memory, capped by the cgroup's memory limit; 0 when neither is known.
size_t usable_memory_bytes();

// Whole CPUs a cgroup v2 `cpu.max` ("QUOTA PERIOD", or "max PERIOD" for none) allows, rounded down
// and at least 1; nullopt for no limit or text that is not a limit.
std::optional<int> cpus_of_cpu_max(std::string_view cpu_max);
// The same from cgroup v1's cpu.cfs_quota_us and cpu.cfs_period_us (a quota of -1: no limit).
std::optional<int> cpus_of_cfs_quota(int64_t quota_us, int64_t period_us);
// The bytes of a cgroup memory limit: v2's `memory.max` ("max" for none) or v1's
// memory.limit_in_bytes (2^62 and above mean none); nullopt for no limit or text that is not one.
std::optional<uint64_t> bytes_of_memory_limit(std::string_view limit);

}  // namespace tandem
