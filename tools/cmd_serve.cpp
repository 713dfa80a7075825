// tandem serve: the OpenAI-compatible HTTP server (src/server) over the engine (src/runtime).
// Starts listening first, so that GET /health says "loading" while the model loads; then serves
// until SIGINT or SIGTERM, when it stops taking generations, lets open ones finish for a grace
// period, cancels the rest and exits 0.
#include <fmt/format.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "cli_common.h"
#include "commands.h"
#include "core/error.h"
#include "core/process_limits.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/kernels.h"
#include "runtime/engine.h"
#include "server/http_server.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;

struct ServeOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  int threads = 0;
  int parallel = 8;
  int max_queue = 128;
  std::string kv_memory;
  int ctx_size = 0;
  int max_step_tokens = 256;
  std::string kv_dtype = "auto";
  bool kv_prefault = false;
  bool no_prefix_cache = false;
  std::string weights = "resident";
  std::string weight_layout = "auto";
  std::string served_model_name;
  std::string max_body_bytes = "16MiB";
  int http_threads = 0;
  double shutdown_timeout = 10.0;
  bool no_request_log = false;
  std::vector<std::string> allowed_origins;
};

// "2GiB", "512MiB", "1.5G", "64KB", "1000000" -> bytes. The i-forms and bare K/M/G/T are powers
// of 1024; KB/MB/GB/TB are powers of 1000.
size_t parse_byte_size(const std::string& option, const std::string& text) {
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    fail("{}: '{}' is not a size (examples: 2GiB, 512MiB, 1000000)", option, text);
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  const char prefixes[] = "KMGT";
  for (int i = 0; i < 4; ++i) {
    const std::string p(1, prefixes[i]);
    if (unit == p || unit == p + "IB") scale = std::pow(1024.0, i + 1);
    if (unit == p + "B") scale = std::pow(1000.0, i + 1);
  }
  if (scale == 0 || !(value > 0) || !std::isfinite(value))
    fail("{}: '{}' is not a positive size (examples: 2GiB, 512MiB, 1000000)", option, text);
  return size_t(value * scale);
}

// Default KV budget: a quarter of the memory this process may use (the machine's, or its cgroup's
// limit in a container), between 1 and 16 GiB. The pool is reserved address space; pages are backed
// only as sequences use them (all at start-up with --kv-prefault).
size_t default_kv_memory() {
  const size_t memory = usable_memory_bytes();
  const double quarter = memory > 0 ? double(memory) / 4.0 : double(size_t(4) << 30);
  return size_t(std::clamp(quarter, double(size_t(1) << 30), double(size_t(16) << 30)));
}

std::string folder_name(const std::string& dir) {
  fs::path p(dir);
  while (!p.empty() && p.filename().empty()) p = p.parent_path();  // "models/gemma/" -> "gemma"
  const std::string name = p.filename().string();
  return name.empty() ? "model" : name;
}

// The demo model may have been made before a tokenizer was at hand (by `generate`); give it the one
// in TANDEM_DEMO_TOKENIZER now.
void add_demo_tokenizer(const std::string& dir) {
  const char* tokenizer = std::getenv("TANDEM_DEMO_TOKENIZER");
  if (!tokenizer || fs::exists(dir + "/tokenizer.json")) return;
  std::error_code ec;
  fs::copy_file(tokenizer, dir + "/tokenizer.json", ec);
  if (ec) fail("TANDEM_DEMO_TOKENIZER={}: cannot copy it into {}: {}", tokenizer, dir, ec.message());
}

// SIGINT/SIGTERM: a process-wide handler writes the signal number into a pipe and one thread
// reads it. (sigwait with blocked signals is not enough: threads started before serve() — MPI's,
// for one — would still take the signal with its default action.)
struct ShutdownSignals {
  std::mutex mutex;
  std::condition_variable arrived;
  int count = 0;
  bool serving = false;
  std::function<void()> on_repeat;  // a second signal: stop waiting for open requests
};

int g_signal_pipe[2] = {-1, -1};

extern "C" void forward_signal(int sig) {
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
}

std::shared_ptr<ShutdownSignals> watch_shutdown_signals() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC) != 0) fail("cannot create the signal pipe");
  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
  auto signals = std::make_shared<ShutdownSignals>();
  std::thread([signals] {
    for (;;) {
      unsigned char sig = 0;
      if (::read(g_signal_pipe[0], &sig, 1) != 1) continue;
      std::unique_lock lock(signals->mutex);
      if (!signals->serving) {
        // Nothing is in flight while the model loads: leave at once.
        std::fprintf(stderr, "tandem: %s while loading; exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::_Exit(0);
      }
      if (++signals->count > 1 && signals->on_repeat) signals->on_repeat();
      signals->arrived.notify_all();
    }
  }).detach();
  return signals;
}

void serve(const ServeOptions& o) {
  if (o.parallel < 1) fail("--parallel must be at least 1");
  if (o.max_queue < 0) fail("--max-queue must be >= 0 (0: no queue, only the --parallel slots)");
  if (o.max_step_tokens < o.parallel)
    fail("--max-step-tokens ({}) must be at least --parallel ({}): a step holds one token of every running sequence",
         o.max_step_tokens, o.parallel);
  if (o.ctx_size < 0 || o.ctx_size == 1)
    fail("--ctx-size must be 0 (the model's limit) or at least 2 (a prompt token and one to generate)");
  if (o.port < 0 || o.port > 65535) fail("--port must be in 0..65535");
  const size_t kv_bytes = o.kv_memory.empty() ? default_kv_memory() : parse_byte_size("--kv-memory", o.kv_memory);
  std::string api_key = o.api_key;
  if (api_key.empty())
    if (const char* env = std::getenv("TANDEM_API_KEY")) api_key = env;

  // Under mpirun (tensor parallelism) rank 0 serves HTTP and runs the engine; the other ranks
  // execute the steps it broadcasts.
  Communicator& comm = world();
  const bool leader = comm.rank() == 0;
  // mpirun forwards SIGINT/SIGTERM to every rank. Rank 0 drains and then sends the followers the
  // Shutdown plan; a follower that died on the signal instead made mpirun end the job mid-drain (open
  // streams cut without [DONE], exit status 1).
  if (!leader) {
    std::signal(SIGINT, SIG_IGN);
    std::signal(SIGTERM, SIG_IGN);
  }
  std::shared_ptr<ShutdownSignals> signals;
  std::unique_ptr<server::HttpServer> server;
  int port = o.port;
  if (leader) {
    signals = watch_shutdown_signals();
    server::HttpServerOptions http;
    http.host = o.host;
    http.port = o.port;
    http.api_key = api_key;
    http.max_body_bytes = parse_byte_size("--max-body-bytes", o.max_body_bytes);
    http.connection_threads = o.http_threads > 0 ? o.http_threads : std::min(1024, o.parallel + o.max_queue + 16);
    http.log_requests = !o.no_request_log;
    http.allowed_origins = o.allowed_origins;
    server = std::make_unique<server::HttpServer>(http);
    port = server->start();
    fmt::print(stderr, "tandem: listening on http://{}:{} (loading the model){}\n", o.host, port,
               api_key.empty() ? "" : "; API key required");
  }

  // Rank 0 may synthesize the demo model; the others wait for it.
  std::string dir = leader ? resolve_model_dir(o.model_dir) : std::string();
  comm.barrier();
  if (!leader) dir = resolve_model_dir(o.model_dir);
  std::optional<Tokenizer> tokenizer;
  if (leader) {
    if (o.model_dir.empty()) add_demo_tokenizer(dir);
    const std::string tokenizer_file = dir + "/tokenizer.json";
    if (!fs::exists(tokenizer_file))
      fail("{} is missing: `tandem serve` needs the model's tokenizer. {}", tokenizer_file,
           o.model_dir.empty() ? "For the demo model, set TANDEM_DEMO_TOKENIZER to a Gemma 4 tokenizer.json "
                                 "(scripts/run.sh prepares one with scripts/gemma4_tokenizer.py)."
                               : "Copy the tokenizer.json of the Hugging Face checkpoint into that folder.");
    tokenizer = Tokenizer::from_file(tokenizer_file);
  }
  ThreadPool pool(o.threads > 0 ? o.threads : default_threads());
  auto checkpoint = Gemma4Checkpoint::open(dir, ShardPlan{comm.rank(), comm.size()}, weight_residency(o.weights), pool,
                                           /*show_progress=*/leader,
                                           layout_chooser(o.weight_layout, o.weights));
  if (tokenizer && tokenizer->vocab_size() > checkpoint->config.vocab_size)
    fmt::print(stderr, "tandem: warning: the tokenizer has {} ids but the model only {}; prompts with the extra "
               "ids will be refused\n", tokenizer->vocab_size(), checkpoint->config.vocab_size);

  // Cold PLE rows are disk reads (warm_ple_table); fill the page cache behind the first requests.
  // Declared after the checkpoint, so it stops and joins before the checkpoint goes away.
  std::jthread warm_ple([&checkpoint](std::stop_token stop) { checkpoint->warm_ple_table(stop); });

  cpu::CpuOps ops(pool);
  EngineOptions engine_options;
  engine_options.worker.max_slots = o.parallel;
  engine_options.worker.max_step_tokens = o.max_step_tokens;
  engine_options.worker.kv_memory_bytes = kv_bytes;
  engine_options.worker.kv_dtype = kv_dtype_option(o.kv_dtype, checkpoint->weights);
  engine_options.worker.kv_prefault = o.kv_prefault;
  engine_options.worker.prefix_reuse = !o.no_prefix_cache;
  engine_options.max_waiting = o.max_queue;
  engine_options.context_limit = o.ctx_size;
  engine_options.sampling_pool = &pool;
  if (!leader) {
    run_follower(*checkpoint, ops, comm, engine_options.worker);
    return;
  }
  Engine engine(*checkpoint, ops, comm, engine_options);

  const GenerationConfig& g = checkpoint->generation;
  SamplingParams defaults;
  defaults.temperature = g.temperature;
  defaults.top_k = g.top_k;
  defaults.top_p = g.top_p;
  defaults.min_p = g.min_p;
  defaults.repetition_penalty = g.repetition_penalty;
  const std::string name = o.served_model_name.empty() ? folder_name(dir) : o.served_model_name;
  server->set_model(std::make_unique<server::ServedModel>(server::ServedModel{
      .engine = engine,
      .tokenizer = *tokenizer,
      .name = name,
      .stop_token_ids = std::vector<int32_t>(g.stop_token_ids.begin(), g.stop_token_ids.end()),
      .default_sampling = defaults,
  }));
  {
    std::lock_guard lock(signals->mutex);
    signals->serving = true;
    signals->on_repeat = [&server] { server->interrupt_drain(); };
  }
  fmt::print(stderr,
             "tandem: ready: serving '{}' from {} on http://{}:{} (context {} tokens, {} sequences at once, KV {:.0f} "
             "MiB {}{}, {} weight layout, {} threads{})\n",
             name, dir, o.host, port, engine.context_limit(), o.parallel, double(kv_bytes) / 1048576.0,
             kv_dtype_name(engine_options.worker.kv_dtype),
             o.kv_prefault ? " prefaulted" : "",
             loaded_weight_layout(checkpoint->weights), pool.size(),
             comm.size() > 1 ? fmt::format(", {} ranks", comm.size()) : "");

  {
    std::unique_lock lock(signals->mutex);
    signals->arrived.wait(lock, [&] { return signals->count > 0; });
  }
  fmt::print(stderr, "tandem: shutting down: no new generations; waiting up to {:.0f}s for open ones (signal again "
             "to cancel them now)\n", o.shutdown_timeout);
  const int left = server->drain(std::chrono::milliseconds(int64_t(o.shutdown_timeout * 1000)));
  if (left > 0) fmt::print(stderr, "tandem: cancelling {} open request(s)\n", left);
  engine.shutdown();  // finishes what is left as cancelled; their streams end with an error event
  // Let those streams write the error event and [DONE] before stop() closes their sockets.
  if (left > 0) server->drain(std::chrono::seconds(5));
  {
    std::lock_guard lock(signals->mutex);
    signals->on_repeat = nullptr;
  }
  server->stop();
  fmt::print(stderr, "tandem: stopped\n");
}

}  // namespace

void register_serve(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server with continuous batching (docs/server.md)");
  auto o = std::make_shared<ServeOptions>();
  cmd->add_option("--model", o->model_dir, "Model folder (Hugging Face layout, with tokenizer.json); default: the demo model")
      ->check(kNonEmptyPath);
  cmd->add_option("--host", o->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", o->port, "Port to listen on (0: any free port)")->capture_default_str();
  cmd->add_option("--api-key", o->api_key, "Require 'Authorization: Bearer KEY' on every route but /health "
                  "(default: $TANDEM_API_KEY, else none)");
  cmd->add_option("--threads", o->threads, "Compute threads (default: the CPUs this process may use: its affinity mask, capped by a cgroup CPU quota)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--parallel", o->parallel, "Most sequences generating at once")->capture_default_str();
  cmd->add_option("--max-queue", o->max_queue, "Most requests waiting beyond those; more get 429")->capture_default_str();
  cmd->add_option("--kv-memory", o->kv_memory, "KV cache budget, e.g. 2GiB (default: a quarter of RAM, or of the cgroup's memory limit, 1 to 16 GiB)");
  cmd->add_option("--ctx-size", o->ctx_size, "Context limit in tokens (default: the model's, limited by the KV cache)");
  cmd->add_option("--max-step-tokens", o->max_step_tokens, "Tokens per engine step (prefill chunks plus decodes)")
      ->capture_default_str();
  cmd->add_option("--weights", o->weights,
                  "resident: copy the streamed weights into huge-page memory (fastest decode); mapped: use them "
                  "in place from the file mappings (zero-copy, fastest start)")
      ->check(CLI::IsMember({"resident", "mapped"}))
      ->capture_default_str();
  add_weight_layout_option(*cmd, o->weight_layout);
  add_kv_dtype_option(*cmd, o->kv_dtype);
  cmd->add_flag("--kv-prefault", o->kv_prefault,
                "Back the whole KV budget with memory at start-up (huge pages where allowed) instead of as "
                "sequences first use it: no page faults in the steps, the memory committed up front");
  cmd->add_flag("--no-prefix-cache", o->no_prefix_cache,
                "Give an ended request's KV blocks back at once instead of keeping them for the next prompt that "
                "starts the same (the next turn of a chat prefills only its new tokens), and pin no prompt windows");
  cmd->add_option("--served-model-name", o->served_model_name, "Model id in the API (default: the folder name)");
  cmd->add_option("--max-body-bytes", o->max_body_bytes, "Largest request body; larger ones get 413")
      ->capture_default_str();
  cmd->add_option("--allowed-origins", o->allowed_origins,
                  "Browser origins that may call the API (CORS), comma-separated, or '*' for any (default: none)")
      ->delimiter(',');
  cmd->add_option("--http-threads", o->http_threads,
                  "Connections served at once (default: --parallel + --max-queue + 16)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--shutdown-timeout", o->shutdown_timeout,
                  "Seconds open requests may run after SIGINT/SIGTERM before they are cancelled")
      ->check(kFiniteNonNegative)
      ->capture_default_str();
  cmd->add_flag("--no-request-log", o->no_request_log, "Do not log one line per request on stderr");
  cmd->callback([o] { serve(*o); });
}

}  // namespace tandem::cli
