// tandem logits --model DIR --ids 2,17,5: one row of logits per input position, as JSON.
#include <cstdio>

#include "cli_common.h"
#include "commands.h"
#include "model/checkpoint.h"
#include "model/reference.h"

namespace tandem::cli {

namespace {

struct LogitsOptions {
  std::string model;
  std::string ids;
  int threads = 0;
};

void print_logits(const LogitsOptions& o) {
  const std::vector<int32_t> ids = parse_id_list(o.ids);
  auto ckpt = Gemma4Checkpoint::open(resolve_model_dir(o.model));
  ThreadPool pool(o.threads);
  ReferenceModel model(ckpt->config, ckpt->weights, &pool);
  const auto rows = model.forward(ids, /*all_positions=*/true);
  std::string out = "{\"logits\": [";
  for (size_t r = 0; r < rows.size(); ++r) {
    out += r ? ",\n[" : "\n[";
    for (size_t i = 0; i < rows[r].size(); ++i) {
      if (i) out += ',';
      append_float(out, rows[r][i]);
    }
    out += ']';
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void register_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Print the logits at every position of a token sequence (JSON)");
  auto o = std::make_shared<LogitsOptions>();
  cmd->add_option("--model", o->model, "Model folder; default: the demo model");
  cmd->add_option("--ids", o->ids, "Comma-separated token ids")->required();
  cmd->add_option("--threads", o->threads, "Threads (default: all cores)");
  cmd->callback([o] { print_logits(*o); });
}

}  // namespace tandem::cli
