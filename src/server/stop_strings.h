#pragma once
// Stop strings over streamed text. Text that might be the start of a stop string is held back until
// it is decided, so a client never sees part of a stop string; when one appears, everything from it
// on is dropped (OpenAI returns the text before the stop string).
#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);

  // Appends `text`; returns what became safe to release. After a match, returns the text before the
  // stop string once and nothing ever after.
  std::string push(std::string_view text);
  // The end of the output: releases what was held back.
  std::string flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }  // the stop string found

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tandem::server
