#include "core/files.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tandem {

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read: {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("{}: read failed", path);
  return text.str();
}

}  // namespace tandem
