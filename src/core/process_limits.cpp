#include "core/process_limits.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>
#ifdef __linux__
#include <sched.h>
#endif

namespace tandem {

namespace {

std::string_view trimmed(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  return text;
}

template <typename T>
std::optional<T> parse_integer(std::string_view text) {
  text = trimmed(text);
  T value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<std::string> read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The text of one interface file of the cgroup this process is in (/proc/self/cgroup names it;
// inside a container's cgroup namespace it is "/"): cgroup v2's `v2_file` in the unified
// hierarchy, else v1's `v1_file` in the hierarchy that has `controller`.
std::optional<std::string> cgroup_file(const std::string& controller, const std::string& v1_file,
                                       const std::string& v2_file) {
  const std::optional<std::string> membership = read_text("/proc/self/cgroup");
  if (!membership) return std::nullopt;
  std::istringstream lines(*membership);
  std::optional<std::string> v1;
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH"; v2 has ID 0 and no controllers.
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    if (controllers.empty()) {
      if (auto text = read_text("/sys/fs/cgroup" + path + "/" + v2_file)) return text;
    } else if (!v1 && ("," + controllers + ",").find("," + controller + ",") != std::string::npos) {
      for (const std::string& root : {"/sys/fs/cgroup/" + controller, "/sys/fs/cgroup/" + controllers})
        if ((v1 = read_text(root + path + "/" + v1_file))) break;
    }
  }
  return v1;
}

int affinity_cpus() {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  return int(std::thread::hardware_concurrency());
}

std::optional<int> cgroup_cpus() {
  if (const auto cpu_max = cgroup_file("cpu", "cpu.cfs_quota_us", "cpu.max")) {
    if (cpu_max->find(' ') != std::string::npos) return cpus_of_cpu_max(*cpu_max);  // v2
    const auto period = cgroup_file("cpu", "cpu.cfs_period_us", "cpu.max");
    const auto q = parse_integer<int64_t>(*cpu_max), p = period ? parse_integer<int64_t>(*period) : std::nullopt;
    if (q && p) return cpus_of_cfs_quota(*q, *p);
  }
  return std::nullopt;
}

}  // namespace

std::optional<int> cpus_of_cfs_quota(int64_t quota_us, int64_t period_us) {
  if (quota_us <= 0 || period_us <= 0) return std::nullopt;
  return int(std::max<int64_t>(1, quota_us / period_us));
}

std::optional<int> cpus_of_cpu_max(std::string_view cpu_max) {
  cpu_max = trimmed(cpu_max);
  const size_t space = cpu_max.find(' ');
  if (space == std::string_view::npos || cpu_max.substr(0, space) == "max") return std::nullopt;
  const auto quota = parse_integer<int64_t>(cpu_max.substr(0, space));
  const auto period = parse_integer<int64_t>(cpu_max.substr(space + 1));
  if (!quota || !period) return std::nullopt;
  return cpus_of_cfs_quota(*quota, *period);
}

std::optional<uint64_t> bytes_of_memory_limit(std::string_view limit) {
  const auto bytes = parse_integer<uint64_t>(limit);
  if (!bytes || *bytes == 0 || *bytes >= (uint64_t(1) << 62)) return std::nullopt;
  return bytes;
}

int usable_cpus() {
  int n = affinity_cpus();
  if (const std::optional<int> quota = cgroup_cpus()) n = std::min(n, *quota);
  return std::max(1, n);
}

size_t usable_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  uint64_t bytes = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : 0;
  if (const auto text = cgroup_file("memory", "memory.limit_in_bytes", "memory.max"))
    if (const auto limit = bytes_of_memory_limit(*text)) bytes = bytes ? std::min(bytes, *limit) : *limit;
  return size_t(bytes);
}

}  // namespace tandem
