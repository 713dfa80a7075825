#include "tokenizer_fixtures.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "support/test_support.h"

namespace tandem::test {

namespace fs = std::filesystem;

std::string tiny_tokenizer_json(const TinyTokenizerSpec& spec) {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  int32_t id = 0;
  for (const char* special : {"<pad>", "<eos>", "<bos>", "<unk>"}) vocab[special] = id++;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab[name] = id++;
  }
  for (const std::string& token : spec.tokens) vocab[token] = id++;
  nlohmann::ordered_json merges = nlohmann::ordered_json::array();
  for (const auto& [left, right] : spec.merges) {
    if (spec.pair_merges)
      merges.push_back({left, right});
    else
      merges.push_back(left + " " + right);
  }
  const auto raw = [](const std::string& text) {
    return text.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json::parse(text);
  };
  nlohmann::ordered_json model = {{"type", "BPE"},           {"dropout", nullptr},
                                  {"unk_token", "<unk>"},      {"continuing_subword_prefix", nullptr},
                                  {"end_of_word_suffix", nullptr}, {"fuse_unk", spec.fuse_unk},
                                  {"byte_fallback", spec.byte_fallback}, {"ignore_merges", spec.ignore_merges}};
  model["vocab"] = vocab;
  model["merges"] = merges;
  nlohmann::ordered_json file = {{"version", "1.0"},
                                 {"truncation", nullptr},
                                 {"padding", nullptr},
                                 {"added_tokens", raw(spec.added_tokens)},
                                 {"normalizer", raw(spec.normalizer)},
                                 {"pre_tokenizer", raw(spec.pre_tokenizer)},
                                 {"post_processor", raw(spec.post_processor)},
                                 {"decoder", raw(spec.decoder)},
                                 {"model", model}};
  if (file["added_tokens"].is_null()) file["added_tokens"] = nlohmann::ordered_json::array();
  return file.dump();
}

namespace {
nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_file(path)); }
}  // namespace

const Tokenizer& gemma3_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_file(gemma3_tokenizer_path());
  return tokenizer;
}

const Tokenizer& gemma4_tokenizer() {
  static const Tokenizer tokenizer = Tokenizer::from_file(gemma4_tokenizer_path());
  return tokenizer;
}

std::string corpus_file(int seed, int kilobytes) {
  if (run("node --version").exit_code != 0) return "";
  const std::string target =
      build_cache_dir() + "/corpus-seed" + std::to_string(seed) + "-" + std::to_string(kilobytes) + "kb.json";
  return cached_output(target, "node " + shell_quote(source_dir() + "/tests/js/make_corpus.mjs") + " --seed " +
                                   std::to_string(seed) + " --kb " + std::to_string(kilobytes));
}

std::vector<std::string> read_corpus(const std::string& file) {
  return read_json(file).get<std::vector<std::string>>();
}

PeerEncoding peer_encode(const std::string& tokenizer, const std::string& corpus, bool add_bos) {
  TempDir tmp;
  const std::string out = tmp.file("ids.json");
  const CommandResult r = run_node(source_dir() + "/tests/js/hf_tokenize.mjs",
                                   "encode " + shell_quote(tokenizer) + " " + shell_quote(corpus) + " " +
                                       shell_quote(out) + (add_bos ? " --bos" : ""));
  if (r.exit_code != 0) throw std::runtime_error("hf_tokenize.mjs encode failed: " + r.out + r.err);
  const nlohmann::json result = read_json(out);
  PeerEncoding encoding;
  encoding.ids = result["ids"].get<std::vector<std::vector<int32_t>>>();
  encoding.encode_ms = result["encode_ms"].get<double>();
  encoding.encode_cpu_ms = result["encode_cpu_ms"].get<double>();
  encoding.bytes = result["bytes"].get<double>();
  return encoding;
}

std::vector<std::string> peer_decode(const std::string& tokenizer, const std::vector<std::vector<int32_t>>& ids,
                                     bool skip_special) {
  TempDir tmp;
  write_file(tmp.file("ids.json"), nlohmann::json(ids).dump());
  const std::string out = tmp.file("texts.json");
  const CommandResult r = run_node(source_dir() + "/tests/js/hf_tokenize.mjs",
                                   "decode " + shell_quote(tokenizer) + " " + shell_quote(tmp.file("ids.json")) + " " +
                                       shell_quote(out) + (skip_special ? " --skip-special" : ""));
  if (r.exit_code != 0) throw std::runtime_error("hf_tokenize.mjs decode failed: " + r.out + r.err);
  return read_json(out)["texts"].get<std::vector<std::string>>();
}

std::string expected_round_trip(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 3;
    } else {
      out += text[i++];
    }
  }
  return out;
}

std::string first_difference(const Tokenizer& tokenizer, const std::vector<int32_t>& expected,
                             const std::vector<int32_t>& actual) {
  size_t k = 0;
  while (k < expected.size() && k < actual.size() && expected[k] == actual[k]) ++k;
  if (k == expected.size() && k == actual.size()) return "identical";
  const auto show = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (size_t i = k >= 3 ? k - 3 : 0; i < std::min(ids.size(), k + 5); ++i) {
      const std::string token = nlohmann::json(std::string(tokenizer.id_to_token(ids[i]))).dump();
      s += (i == k ? " >>" : " ") + std::to_string(ids[i]) + "=" + token;
    }
    return s;
  };
  return "first difference at token " + std::to_string(k) + " (expected " + std::to_string(expected.size()) +
         " tokens, got " + std::to_string(actual.size()) + ")\n  expected:" + show(expected) + "\n  actual:  " +
         show(actual);
}

}  // namespace tandem::test
