#pragma once
// Helpers shared by the `tandem` subcommands: option parsing of id lists, the demo model, JSON output.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::cli {

std::vector<int32_t> parse_id_list(const std::string& text);  // "2,17,5" -> {2, 17, 5}; Error if malformed

// The model folder to use: `model` when given, else the demo model, synthesized on first use
// (random weights) in $TANDEM_DEMO_MODEL or ~/.cache/tandem/demo-model.
std::string resolve_model_dir(const std::string& model);

// Appends a float so that it parses back to the same value.
void append_float(std::string& out, float value);

}  // namespace tandem::cli
