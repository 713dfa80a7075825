// tandem generate --model DIR --ids 2,17,5 --max-tokens N: greedy decoding through the KV cache.
#include <fmt/format.h>

#include <algorithm>

#include "cli_common.h"
#include "core/error.h"
#include "commands.h"

namespace tandem::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string ids;
  int max_tokens = 32;
  bool ignore_eos = false;
};

int32_t argmax(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void generate(const GenerateOptions& o) {
  const std::vector<int32_t> prompt = parse_id_list(o.ids);
  if (o.max_tokens < 0) fail("--max-tokens must be >= 0");
  LoadedModel m = load_model(o.model, int(prompt.size()) + o.max_tokens);
  const auto& stops = m.checkpoint->generation.stop_token_ids;
  SequenceModel& model = *m.model;

  std::vector<int32_t> generated;
  if (o.max_tokens > 0) {
    int32_t next = argmax(model.forward(prompt, /*all_positions=*/false).back());
    for (;;) {
      const bool stop = !o.ignore_eos && std::find(stops.begin(), stops.end(), next) != stops.end();
      if (stop) break;
      generated.push_back(next);
      if (int(generated.size()) >= o.max_tokens) break;
      const int32_t step[1] = {next};
      next = argmax(model.forward(step, false).back());
    }
  }
  if (world().rank() == 0) fmt::print("{{\"ids\": [{}]}}\n", fmt::join(generated, ", "));
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Greedy generation from token ids (JSON)");
  auto o = std::make_shared<GenerateOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--ids", o->ids, "Comma-separated prompt token ids")->required();
  cmd->add_option("--max-tokens", o->max_tokens, "Most tokens to generate")->default_val(32);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's stop tokens");
  cmd->callback([o] { generate(*o); });
}

}  // namespace tandem::cli
