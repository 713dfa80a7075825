// tandem chat-template --messages FILE [--tools FILE] [--thinking] [--preserve-thinking]
//                      [--no-generation-prompt]: prints the Gemma 4 prompt for a conversation, exactly
// (no newline is added, so the output can be compared byte for byte).
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "io/checkpoint.h"
#include "core/error.h"
#include "tokenizer/chat_format.h"

namespace tandem::cli {

namespace {

struct ChatTemplateArgs {
  std::string messages_file;
  std::string tools_file;
  bool thinking = false;
  bool preserve_thinking = false;
  bool no_generation_prompt = false;
};

void print_chat_template(const ChatTemplateArgs& args) {
  // The file holds either the messages array or a request-like {"messages": [...], "tools": [...]}.
  nlohmann::json input = read_json_file(args.messages_file);
  nlohmann::json messages;
  ChatOptions options;
  if (input.is_object()) {
    for (const auto& [key, value] : input.items())
      if (key != "messages" && key != "tools")
        fail("{}: unknown key '{}' (the file holds 'messages' and optionally 'tools'; the rest are flags)",
             args.messages_file, key);
    if (!input.contains("messages")) fail("{}: no 'messages'", args.messages_file);
    messages = std::move(input["messages"]);
    if (input.contains("tools")) options.tools = std::move(input["tools"]);
  } else {
    messages = std::move(input);
  }
  if (!args.tools_file.empty()) {
    if (!options.tools.is_null()) fail("tools are given twice: in {} and with --tools", args.messages_file);
    options.tools = read_json_file(args.tools_file);
  }
  options.enable_thinking = args.thinking;
  options.preserve_thinking = args.preserve_thinking;
  options.add_generation_prompt = !args.no_generation_prompt;
  const std::string prompt = render_chat(messages, options);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void register_chat_template(CLI::App& app) {
  auto* cmd = app.add_subcommand("chat-template", "Print the Gemma 4 prompt for a conversation (OpenAI messages)");
  auto args = std::make_shared<ChatTemplateArgs>();
  cmd->add_option("--messages", args->messages_file,
                  "JSON file: a messages array, or an object {\"messages\": [...], \"tools\": [...]}")
      ->required();
  cmd->add_option("--tools", args->tools_file, "JSON file with the OpenAI tools array");
  cmd->add_flag("--thinking", args->thinking, "Enable thinking (<|think|> in the system turn)");
  cmd->add_flag("--preserve-thinking", args->preserve_thinking, "Keep reasoning of earlier tool-calling answers");
  cmd->add_flag("--no-generation-prompt", args->no_generation_prompt, "Do not open the model's turn at the end");
  cmd->callback([args] { print_chat_template(*args); });
}

}  // namespace tandem::cli
