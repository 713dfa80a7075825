#include "server/server_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <mutex>
#include <regex>
#include <stdexcept>
#include <thread>

namespace tandem::test {

namespace fs = std::filesystem;

ServerProcess::~ServerProcess() {
  if (pid_ > 0) stop(SIGKILL, 10);
}

std::string ServerProcess::log() const {
  std::error_code ec;
  return fs::exists(dir_.file("stderr"), ec) ? read_file(dir_.file("stderr")) : "";
}

void ServerProcess::start(const std::string& model_dir, const std::vector<std::string>& extra_args, double timeout_s,
                          const std::vector<std::string>& launcher) {
  std::vector<std::string> args = launcher;
  const std::vector<std::string> own = {tandem_binary(), "serve", "--model", model_dir, "--host", "127.0.0.1", "--port", "0"};
  args.insert(args.end(), own.begin(), own.end());
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  const std::string err_path = dir_.file("stderr");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    // Only async-signal-safe calls between fork and exec (the test process has threads).
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int out = ::open("/dev/null", O_WRONLY);
    if (err < 0 || out < 0) std::_Exit(126);
    ::dup2(err, 2);
    ::dup2(out, 1);
    ::execvp(argv[0], argv.data());
    std::_Exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  const std::regex listening(R"(listening on http://[^:]+:(\d+))");
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("tandem serve exited while starting:\n" + log());
    }
    std::smatch m;
    const std::string text = log();
    if (port_ == 0 && std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
    if (port_ != 0 && curl(base_url() + "/health").status == 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw std::runtime_error("tandem serve did not become ready in time:\n" + log());
}

int ServerProcess::stop(int signal, double timeout_s) {
  if (pid_ <= 0) return -1;
  ::kill(pid_, signal);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int status = 0;
  for (;;) {
    if (::waitpid(pid_, &status, WNOHANG) == pid_) break;
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

nlohmann::json HttpReply::json() const { return nlohmann::json::parse(body); }

HttpReply curl(const std::string& args) {
  const CommandResult r = run("curl -s --max-time 120 -w '\\n%{http_code}' " + args);
  HttpReply reply;
  const size_t cut = r.out.rfind('\n');
  if (cut == std::string::npos) return reply;
  reply.body = r.out.substr(0, cut);
  try {
    reply.status = std::stoi(r.out.substr(cut + 1));
  } catch (const std::exception&) {
    reply.status = 0;
  }
  return reply;
}

nlohmann::json run_client_check(const std::string& check, const ServerProcess& server, const std::string& model,
                                const std::string& extra) {
  const std::string script = source_dir() + "/tests/js/server_client.mjs";
  const CommandResult r = run_node(script, shell_quote(check) + " " + shell_quote(server.base_url()) + " " +
                                               shell_quote(model) + " " + extra);
  if (r.exit_code != 0)
    throw std::runtime_error("node server_client.mjs " + check + " failed (" + std::to_string(r.exit_code) +
                             "):\n" + r.out + r.err);
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    throw std::runtime_error("node server_client.mjs " + check + " printed no JSON: " + r.out + r.err);
  }
}

}  // namespace tandem::test
