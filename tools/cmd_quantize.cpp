// tandem quantize --model DIR --type q8|q4 --out DIR: a Q8/Q4 copy of a checkpoint that --model loads.
#include <fmt/format.h>

#include "commands.h"
#include "model/quantize_checkpoint.h"

namespace tandem::cli {

void register_quantize(CLI::App& app) {
  auto* cmd = app.add_subcommand("quantize", "Write a copy of a checkpoint with its linear weights in q8 or q4");
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto type = std::make_shared<std::string>();
  cmd->add_option("--model", *model, "Checkpoint folder to read")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("--type", *type, "q8 (int8, 8.5 bits per weight) or q4 (4.5 bits per weight)")
      ->required()
      ->check(CLI::IsMember({"q8", "q4"}));
  cmd->add_option("--out", *out, "Folder to write (created if needed)")->required();
  cmd->callback([model, out, type] {
    const WeightFormat format = *type == "q8" ? WeightFormat::Q8 : WeightFormat::Q4;
    const QuantizeSummary s = quantize_checkpoint(*model, *out, format, true);
    fmt::print(stderr, "wrote {}: {} matrices quantized to {}, {} tensors copied, {} dropped; {:.2f} GB -> {:.2f} GB\n",
               *out, s.quantized, *type, s.copied, s.dropped, double(s.bytes_in) / 1e9, double(s.bytes_out) / 1e9);
  });
}

}  // namespace tandem::cli
