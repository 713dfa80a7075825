#include "core/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace tandem {

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), start_(std::chrono::steady_clock::now()) {
  const char* env = std::getenv("TANDEM_PROGRESS");
  enabled_ = env ? std::strcmp(env, "0") != 0 : ::isatty(STDERR_FILENO) != 0;
  last_draw_ = start_;
}

Progress::~Progress() { finish(); }

void Progress::advance(uint64_t amount) {
  done_ += amount;
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ > std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (enabled_) draw(true);
}

void Progress::draw(bool final_line) {
  const double fraction = total_ ? double(std::min(done_, total_)) / double(total_) : 1.0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  constexpr int kWidth = 30;
  char bar[kWidth + 1];
  const int filled = int(fraction * kWidth);
  for (int i = 0; i < kWidth; ++i) bar[i] = i < filled ? '#' : '.';
  bar[kWidth] = 0;
  std::fprintf(stderr, "\r%s [%s] %5.1f%%  %.1f/%.1f GB  %.0fs%s", label_.c_str(), bar,
               fraction * 100.0, done_ / 1e9, total_ / 1e9, seconds, final_line ? "\n" : "");
  std::fflush(stderr);
}

}  // namespace tandem
