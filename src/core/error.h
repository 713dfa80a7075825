#pragma once
// The one error type of Tandem: a message that says what failed and where (file, tensor, field,
// request parameter). Bad input is reported by throwing it, never by aborting.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tandem
