#include "core/usable_cpus.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sched.h>
#endif

namespace tandem {

namespace {

std::optional<int64_t> parse_integer(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  int64_t value = 0;
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

int affinity_cpus() {
#ifdef __linux__
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  return int(std::thread::hardware_concurrency());
}

// The quota of the cgroup this process is in (/proc/self/cgroup names it; inside a container's
// cgroup namespace it is "/"), v2 first, then v1's cpu controller.
std::optional<int> cgroup_cpus() {
  const std::optional<std::string> membership = read_text("/proc/self/cgroup");
  if (!membership) return std::nullopt;
  std::istringstream lines(*membership);
  std::optional<int> limit;
  for (std::string line; std::getline(lines, line);) {
    // "ID:CONTROLLERS:PATH"; v2 has ID 0 and no controllers.
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    std::optional<int> here;
    if (controllers.empty()) {
      for (const std::string& dir : {"/sys/fs/cgroup" + path, std::string("/sys/fs/cgroup")})
        if (const auto text = read_text(dir + "/cpu.max")) {
          here = cpus_of_cpu_max(*text);
          break;
        }
    } else if (("," + controllers + ",").find(",cpu,") != std::string::npos) {
      for (const std::string& root : {std::string("/sys/fs/cgroup/cpu"), std::string("/sys/fs/cgroup/cpu,cpuacct")}) {
        const auto quota = read_text(root + path + "/cpu.cfs_quota_us");
        const auto period = read_text(root + path + "/cpu.cfs_period_us");
        if (!quota || !period) continue;
        const auto q = parse_integer(*quota), p = parse_integer(*period);
        if (q && p) here = cpus_of_cfs_quota(*q, *p);
        break;
      }
    }
    if (here) limit = limit ? std::min(*limit, *here) : *here;
  }
  return limit;
}

}  // namespace

std::optional<int> cpus_of_cfs_quota(int64_t quota_us, int64_t period_us) {
  if (quota_us <= 0 || period_us <= 0) return std::nullopt;
  return int(std::max<int64_t>(1, quota_us / period_us));
}

std::optional<int> cpus_of_cpu_max(std::string_view cpu_max) {
  while (!cpu_max.empty() && (cpu_max.back() == '\n' || cpu_max.back() == ' ')) cpu_max.remove_suffix(1);
  const size_t space = cpu_max.find(' ');
  if (space == std::string_view::npos || cpu_max.substr(0, space) == "max") return std::nullopt;
  const auto quota = parse_integer(cpu_max.substr(0, space)), period = parse_integer(cpu_max.substr(space + 1));
  if (!quota || !period) return std::nullopt;
  return cpus_of_cfs_quota(*quota, *period);
}

int usable_cpus() {
  int n = affinity_cpus();
  if (const std::optional<int> quota = cgroup_cpus()) n = std::min(n, *quota);
  return std::max(1, n);
}

}  // namespace tandem
