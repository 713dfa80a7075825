// tandem tokenize --tokenizer FILE (--text S | --text-file F) [--bos]   -> {"ids": [...]}
// tandem detokenize --tokenizer FILE --ids 1,2,3 [--skip-special]      -> {"text": "..."}
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>

#include "cli_common.h"
#include "commands.h"
#include "core/files.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tandem::cli {

namespace {

struct TokenizeArgs {
  std::string tokenizer;
  std::string text;
  std::string text_file;
  bool bos = false;
};

struct DetokenizeArgs {
  std::string tokenizer;
  std::string ids;
  bool skip_special = false;
};

void print_json(const nlohmann::json& value) {
  const std::string text = value.dump() + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

void tokenize(const TokenizeArgs& args) {
  const Tokenizer tokenizer = Tokenizer::from_file(args.tokenizer);
  const std::string text = args.text_file.empty() ? args.text : read_text_file(args.text_file);
  print_json({{"ids", tokenizer.encode(text, args.bos)}});
}

void detokenize(const DetokenizeArgs& args) {
  const Tokenizer tokenizer = Tokenizer::from_file(args.tokenizer);
  const std::vector<int32_t> ids = args.ids.empty() ? std::vector<int32_t>{} : parse_id_list(args.ids);
  print_json({{"text", tokenizer.decode(ids, {.skip_special_tokens = args.skip_special})}});
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Print the token ids of a text as JSON: {\"ids\": [...]}");
  auto args = std::make_shared<TokenizeArgs>();
  cmd->add_option("--tokenizer", args->tokenizer, "Hugging Face tokenizer.json")->required();
  auto* text = cmd->add_option("--text", args->text, "The text");
  auto* file = cmd->add_option("--text-file", args->text_file, "A file holding the text (read as bytes)");
  text->excludes(file);
  cmd->add_flag("--bos", args->bos, "Add <bos> first (the tokenizer's special tokens)");
  cmd->callback([args, text, file] {
    if (text->count() == 0 && file->count() == 0) fail("give the text with --text or --text-file");
    tokenize(*args);
  });

  auto* decode = app.add_subcommand("detokenize", "Print the text of token ids as JSON: {\"text\": \"...\"}");
  auto dargs = std::make_shared<DetokenizeArgs>();
  decode->add_option("--tokenizer", dargs->tokenizer, "Hugging Face tokenizer.json")->required();
  decode->add_option("--ids", dargs->ids, "Comma-separated token ids, e.g. 2,9259,1902")->required();
  decode->add_flag("--skip-special", dargs->skip_special, "Leave special tokens (<bos>, <turn|>, ...) out");
  decode->callback([dargs] { detokenize(*dargs); });
}

}  // namespace tandem::cli
