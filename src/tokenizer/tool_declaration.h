#pragma once
// A tool's declaration in the system turn, as the template's format_function_declaration macro
// writes it: declaration:NAME{description:<|"|>...<|"|>,parameters:{...}}
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tandem {

// `tool` is one entry of the OpenAI `tools` array ({"type":"function","function":{...}}); `where`
// names it in error messages ("tools[2]"). Throws Error when the tool cannot be rendered.
std::string format_tool_declaration(const nlohmann::json& tool, std::string_view where);

}  // namespace tandem
