// tandem synth --preset NAME --out DIR [--seed S]: a random checkpoint in the published layout.
#include <fmt/format.h>

#include "commands.h"
#include "model/synth.h"

namespace tandem::cli {

void register_synth(CLI::App& app) {
  auto* cmd = app.add_subcommand("synth", "Write a random Gemma 4 checkpoint in the published Hugging Face layout");
  auto options = std::make_shared<SynthOptions>();
  std::string presets = fmt::format("{}", fmt::join(synth_preset_names(), ", "));
  cmd->add_option("--preset", options->preset, "Shape preset: " + presets)->required();
  cmd->add_option("--out", options->out_dir, "Output folder")->required();
  cmd->add_option("--seed", options->seed, "Random seed")->default_val(1);
  cmd->add_option("--tokenizer", options->tokenizer_json, "A tokenizer.json to copy into the checkpoint")
      ->check(CLI::ExistingFile);
  cmd->callback([options] {
    synthesize_checkpoint(*options);
    fmt::print(stderr, "wrote {} ({} preset, seed {})\n", options->out_dir, options->preset, options->seed);
  });
}

}  // namespace tandem::cli
