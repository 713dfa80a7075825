// Reads the pipeline sections of tokenizer.json around the model: added tokens, normalizer,
// pre-tokenizer, decoder and post-processor. Only the kinds Gemma uses are accepted; anything else
// is refused by name rather than tokenized differently from Hugging Face.
#include <string>
#include <vector>

#include "tokenizer/load_stages.h"

namespace tandem::tok {

namespace {

// A pattern given as {"String": "..."}; regular expressions are not supported.
std::string string_pattern(const JsonReader& r, JsonReader::Object o, const std::string& path) {
  const std::string pattern_path = path + ".pattern";
  const JsonReader::Object pattern = r.object(r.required(o, "pattern", path), pattern_path);
  if (auto s = JsonReader::member(pattern, "String")) {
    const std::string_view text = r.string(*s, pattern_path + ".String");
    if (text.empty()) r.fail(pattern_path, "an empty pattern is not supported");
    return std::string(text);
  }
  if (JsonReader::member(pattern, "Regex")) r.fail(pattern_path, "regex patterns are not supported");
  r.fail(pattern_path, "expected {{\"String\": ...}}");
}

Replacement replacement(const JsonReader& r, JsonReader::Object o, const std::string& path) {
  return Replacement{string_pattern(r, o, path), std::string(r.string(r.required(o, "content", path), path + ".content"))};
}

void add_normalizer(const JsonReader& r, JsonReader::Element e, const std::string& path, Normalizer& normalizer) {
  const JsonReader::Object o = r.object(e, path);
  const std::string_view type = r.type(o, path);
  if (type == "Sequence") {
    size_t i = 0;
    for (JsonReader::Element step : r.array(r.required(o, "normalizers", path), path + ".normalizers"))
      add_normalizer(r, step, fmt::format("{}.normalizers[{}]", path, i++), normalizer);
  } else if (type == "Replace") {
    normalizer.replacements.push_back(replacement(r, o, path));
  } else {
    r.fail(path, "unsupported normalizer type \"{}\" (supported: Replace with a string pattern, Sequence)", type);
  }
}

SplitBehavior split_behavior(const JsonReader& r, std::string_view name, const std::string& path) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  r.fail(path, "unknown split behavior \"{}\"", name);
}

}  // namespace

int byte_token_value(std::string_view token, bool lower_case_too) {
  if (token.size() != 6 || token.substr(0, 3) != "<0x" || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    if (c >= '0' && c <= '9') value = value * 16 + (c - '0');
    else if (c >= 'A' && c <= 'F') value = value * 16 + (c - 'A' + 10);
    else if (lower_case_too && c >= 'a' && c <= 'f') value = value * 16 + (c - 'a' + 10);
    else return -1;
  }
  return value;
}

void load_normalizer(const JsonReader& r, JsonReader::Element normalizer, TokenizerData& data) {
  add_normalizer(r, normalizer, "normalizer", data.normalizer);
}

void load_pre_tokenizer(const JsonReader& r, JsonReader::Element pre_tokenizer, TokenizerData& data) {
  const std::string path = "pre_tokenizer";
  const JsonReader::Object o = r.object(pre_tokenizer, path);
  const std::string_view type = r.type(o, path);
  if (type != "Split")
    r.fail(path, "unsupported pre-tokenizer type \"{}\" (supported: Split with a string pattern)", type);
  if (r.flag(o, "invert", false, path)) r.fail(path + ".invert", "inverted Split patterns are not supported");
  PreTokenizer& p = data.pre_tokenizer;
  p.enabled = true;
  p.pattern = string_pattern(r, o, path);
  p.behavior = split_behavior(r, r.string(r.required(o, "behavior", path), path + ".behavior"), path + ".behavior");
}

void load_added_tokens(const JsonReader& r, JsonReader::Array added, TokenizerData& data) {
  std::vector<std::pair<int32_t, bool>> specials;
  size_t index = 0;
  for (JsonReader::Element e : added) {
    const std::string path = fmt::format("added_tokens[{}]", index++);
    const JsonReader::Object o = r.object(e, path);
    const int64_t id = r.integer(r.required(o, "id", path), path + ".id");
    if (id < 0 || id >= kMaxTokenId) r.fail(path + ".id", "invalid id {} (ids go up to {})", id, kMaxTokenId - 1);
    const std::string_view content = r.string(r.required(o, "content", path), path + ".content");
    if (content.empty()) r.fail(path + ".content", "an added token cannot be empty");
    for (std::string_view unsupported : {"lstrip", "rstrip", "single_word"})
      if (r.flag(o, unsupported, false, path))
        r.fail(path, "added token \"{}\" sets {}, which is not supported", content, unsupported);
    const bool special = r.flag(o, "special", false, path);
    // The peer's default; Hugging Face writes the flag explicitly anyway.
    const bool normalized = r.flag(o, "normalized", !special, path);

    data.tokens.set(static_cast<int32_t>(id), content);
    specials.emplace_back(static_cast<int32_t>(id), special);
    if (normalized && !data.normalizer.empty()) {
      std::string spelled;
      data.normalizer.apply(content, spelled);
      data.normalized_added.add(spelled, static_cast<int32_t>(id));
    } else {
      data.raw_added.add(content, static_cast<int32_t>(id));
    }
  }
  data.special.assign(static_cast<size_t>(data.tokens.size()), 0);
  for (auto [id, special] : specials) data.special[id] = special;
}

// Accepted: Replace steps (string patterns), then optionally ByteFallback, then optionally Fuse,
// alone or in a Sequence. Decoding is then per token text (Replace), bytes of consecutive
// <0xNN> tokens read as UTF-8 (ByteFallback), concatenation (Fuse, and the final join).
void load_decoder(const JsonReader& r, std::optional<JsonReader::Element> decoder, TokenizerData& data) {
  if (!decoder) r.fail("decoder", "a decoder is required (tokens would be joined with spaces)");
  std::vector<std::pair<JsonReader::Object, std::string>> steps;
  const JsonReader::Object top = r.object(*decoder, "decoder");
  if (r.type(top, "decoder") == "Sequence") {
    size_t i = 0;
    for (JsonReader::Element e : r.array(r.required(top, "decoders", "decoder"), "decoder.decoders")) {
      std::string path = fmt::format("decoder.decoders[{}]", i++);
      steps.emplace_back(r.object(e, path), std::move(path));
    }
  } else {
    steps.emplace_back(top, "decoder");
  }

  std::vector<Replacement> replacements;
  bool byte_fallback = false, fused = false;
  for (const auto& [o, path] : steps) {
    const std::string_view type = r.type(o, path);
    if (fused) r.fail(path, "decoder steps after Fuse are not supported");
    if (type == "Replace") {
      if (byte_fallback) r.fail(path, "a Replace decoder after ByteFallback is not supported");
      replacements.push_back(replacement(r, o, path));
    } else if (type == "ByteFallback") {
      byte_fallback = true;
    } else if (type == "Fuse") {
      fused = true;
    } else {
      r.fail(path, "unsupported decoder type \"{}\" (supported: Replace, ByteFallback, Fuse)", type);
    }
  }

  Normalizer replace_steps{replacements};  // the same left-to-right string replacement
  std::string text;
  for (int32_t id = 0; id < data.tokens.size(); ++id) {
    const auto token = data.tokens.text(id);
    if (!token) {
      data.decoded.add({}, -1);
      continue;
    }
    replace_steps.apply(*token, text);
    const int byte = byte_fallback ? byte_token_value(text, /*lower_case_too=*/true) : -1;
    data.decoded.add(byte >= 0 ? std::string_view{} : std::string_view(text), byte);
  }
}

// TemplateProcessing's "single" template: special tokens around sequence $A. Encoding with
// add_bos adds them, like Hugging Face's add_special_tokens=true.
void load_post_processor(const JsonReader& r, JsonReader::Element post_processor, TokenizerData& data) {
  const std::string path = "post_processor";
  const JsonReader::Object o = r.object(post_processor, path);
  const std::string_view type = r.type(o, path);
  if (type != "TemplateProcessing")
    r.fail(path, "unsupported post-processor type \"{}\" (supported: TemplateProcessing)", type);
  const auto special_tokens = JsonReader::member(o, "special_tokens");
  bool seen_sequence = false;
  size_t i = 0;
  for (JsonReader::Element e : r.array(r.required(o, "single", path), path + ".single")) {
    const std::string item_path = fmt::format("{}.single[{}]", path, i++);
    const JsonReader::Object item = r.object(e, item_path);
    if (auto sequence = JsonReader::member(item, "Sequence")) {
      const JsonReader::Object s = r.object(*sequence, item_path + ".Sequence");
      const std::string_view id = r.string(r.required(s, "id", item_path + ".Sequence"), item_path + ".Sequence.id");
      if (id != "A" || seen_sequence) r.fail(item_path, "expected the sequence $A once");
      seen_sequence = true;
      continue;
    }
    const auto special = JsonReader::member(item, "SpecialToken");
    if (!special) r.fail(item_path, "expected a SpecialToken or a Sequence");
    const JsonReader::Object s = r.object(*special, item_path + ".SpecialToken");
    const std::string_view name = r.string(r.required(s, "id", item_path), item_path + ".SpecialToken.id");
    std::vector<int32_t>& target = seen_sequence ? data.template_suffix : data.template_prefix;
    std::optional<JsonReader::Element> listed;
    if (special_tokens) listed = JsonReader::member(r.object(*special_tokens, path + ".special_tokens"), name);
    if (listed) {
      const std::string ids_path = fmt::format("{}.special_tokens[\"{}\"].ids", path, name);
      for (JsonReader::Element id : r.array(r.required(r.object(*listed, ids_path), "ids", ids_path), ids_path)) {
        const int64_t value = r.integer(id, ids_path);
        if (value < 0 || value >= data.tokens.size()) r.fail(ids_path, "id {} is out of range", value);
        target.push_back(static_cast<int32_t>(value));
      }
    } else if (auto id = data.tokens.find(name)) {
      target.push_back(*id);
    } else {
      r.fail(item_path, "special token \"{}\" is not in the vocabulary", name);
    }
  }
  if (!seen_sequence) r.fail(path + ".single", "the template has no sequence $A");
}

}  // namespace tandem::tok
