#include "server/request_log.h"

#include <fmt/format.h>

#include <cstdio>

namespace tandem::server {

namespace {
struct RequestLogRecord {
  std::chrono::steady_clock::time_point start{};
  bool started = false;
  std::string notes;
};
thread_local RequestLogRecord t_record;
}  // namespace

void request_log_note(const std::string& note) {
  if (!t_record.notes.empty()) t_record.notes += ' ';
  t_record.notes += note;
}

void request_log_begin() {
  t_record.start = std::chrono::steady_clock::now();
  t_record.started = true;
  t_record.notes.clear();
}

void request_log_end(const std::string& method, const std::string& path, int status, bool enabled) {
  if (enabled) {
    std::string elapsed = "-";
    if (t_record.started)
      elapsed = fmt::format("{:.1f}ms", std::chrono::duration<double, std::milli>(
                                            std::chrono::steady_clock::now() - t_record.start).count());
    const std::string line = fmt::format("tandem: {} {} {} {}{}{}\n", method, path, status, elapsed,
                                         t_record.notes.empty() ? "" : " ", t_record.notes);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  t_record = RequestLogRecord{};
}

}  // namespace tandem::server
