// tandem logits --model DIR --ids 2,17,5: one row of logits per input position, as JSON.
#include <cstdio>

#include "cli_common.h"
#include "commands.h"

namespace tandem::cli {

namespace {

struct LogitsOptions {
  ModelOptions model;
  std::string ids;
};

void print_logits(const LogitsOptions& o) {
  const std::vector<int32_t> ids = parse_id_list(o.ids);
  LoadedModel m = load_model(o.model, int(ids.size()));
  const auto rows = m.model->forward(ids, /*all_positions=*/true);
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
  if (world().rank() == 0) std::fwrite(out.data(), 1, out.size(), stdout);
}

}  // namespace

void register_logits(CLI::App& app) {
  auto* cmd = app.add_subcommand("logits", "Print the logits at every position of a token sequence (JSON)");
  auto o = std::make_shared<LogitsOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--ids", o->ids, "Comma-separated token ids")->required();
  cmd->callback([o] { print_logits(*o); });
}

}  // namespace tandem::cli
