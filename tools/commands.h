#pragma once
// Each `tandem` subcommand lives in its own cmd_*.cpp and registers itself on the CLI app here.
#include <CLI/CLI.hpp>

namespace tandem::cli {

void register_inspect(CLI::App& app);
void register_logits(CLI::App& app);
void register_generate(CLI::App& app);
void register_synth(CLI::App& app);
void register_quantize(CLI::App& app);
void register_chat_template(CLI::App& app);
void register_tokenize(CLI::App& app);  // tokenize and detokenize
void register_bench(CLI::App& app);
void register_serve(CLI::App& app);

}  // namespace tandem::cli
