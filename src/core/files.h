#pragma once
// Small whole-file helpers with errors that name the file.
#include <string>

namespace tandem {

bool file_exists(const std::string& path);       // a regular file
std::string read_text_file(const std::string& path);  // Error naming the file if it can't be read

}  // namespace tandem
