#pragma once
// A progress bar on stderr for long writes and loads. Draws only when stderr is a terminal
// (or TANDEM_PROGRESS=1), so logs and tests stay clean.
#include <chrono>
#include <cstdint>
#include <string>

namespace tandem {

class Progress {
 public:
  Progress(std::string label, uint64_t total);
  ~Progress();
  void advance(uint64_t amount);
  void finish();

 private:
  void draw(bool final_line);
  std::string label_;
  uint64_t total_;
  uint64_t done_ = 0;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace tandem
