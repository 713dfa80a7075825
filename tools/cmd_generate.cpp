// tandem generate --model DIR --ids 2,17,5 --max-tokens N: greedy decoding through the KV cache.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli_common.h"
#include "core/error.h"
#include "commands.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string ids;
  std::string prompt;
  int max_tokens = 32;
  bool ignore_eos = false;
};

int32_t argmax(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

void generate(const GenerateOptions& o) {
  if (o.max_tokens < 0) fail("--max-tokens must be >= 0");
  if (o.ids.empty() == o.prompt.empty()) fail("give exactly one of --ids and --prompt");
  // --prompt: raw text, tokenized with the model's tokenizer.json after a <bos>.
  std::optional<Tokenizer> tokenizer;
  if (!o.prompt.empty()) tokenizer = Tokenizer::from_file(tokenizer_path(resolve_model_dir(o.model.model_dir)));
  const std::vector<int32_t> prompt = tokenizer ? tokenizer->encode(o.prompt, /*add_bos=*/true) : parse_id_list(o.ids);
  LoadedModel m = load_model(o.model, int64_t(prompt.size()) + o.max_tokens);
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
  if (world().rank() != 0) return;
  nlohmann::ordered_json out = {{"ids", generated}};
  if (tokenizer) out["text"] = tokenizer->decode(generated);
  fmt::print("{}\n", out.dump());
}

}  // namespace

void register_generate(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Greedy generation from token ids or a text prompt (JSON)");
  auto o = std::make_shared<GenerateOptions>();
  add_model_options(*cmd, o->model);
  cmd->add_option("--ids", o->ids, "Comma-separated prompt token ids");
  cmd->add_option("--prompt", o->prompt, "Prompt text (tokenized with the model's tokenizer.json, after <bos>)");
  cmd->add_option("--max-tokens", o->max_tokens, "Most tokens to generate")->default_val(32);
  cmd->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at the model's stop tokens");
  cmd->callback([o] { generate(*o); });
}

}  // namespace tandem::cli
