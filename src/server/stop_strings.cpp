#include "server/stop_strings.h"

#include <algorithm>

namespace tandem::server {

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  stops_.erase(std::remove(stops_.begin(), stops_.end(), std::string()), stops_.end());
}

std::string StopStringMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  // Only a match that ends in the new text can be new: earlier text held no complete stop string.
  const size_t old_size = pending_.size();
  pending_.append(text);
  size_t earliest = std::string::npos;
  for (const std::string& stop : stops_) {
    const size_t from = old_size >= stop.size() - 1 ? old_size - (stop.size() - 1) : 0;
    const size_t at = pending_.find(stop, from);
    if (at != std::string::npos && at < earliest) {
      earliest = at;
      matched_ = stop;
    }
  }
  if (earliest != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, earliest);
    pending_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, pending_.size()); n > hold; --n) {
      if (std::string_view(pending_).substr(pending_.size() - n) == std::string_view(stop).substr(0, n)) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace tandem::server
