// Parses tokenizer.json and runs the load stages in dependency order.
//
// The file is 33 MB, nearly all of it model.vocab and model.merges. One On-Demand pass reads those
// two straight from the input as it meets them, and copies every other value into a small JSON
// document that is then read through the DOM. Compared with building a DOM of the whole file this
// touches a fraction of the memory, which is what loading costs most.
#include <simdjson.h>

#include "tokenizer/load_stages.h"

namespace tandem::tok {

namespace {

namespace od = simdjson::ondemand;

struct Sections {
  std::string rest;  // a JSON object: the document without model.vocab and model.merges
  bool has_model = false;
  bool has_vocab = false;
  bool has_merges = false;
  std::optional<std::string_view> late_merges;  // raw JSON of merges met before the vocabulary
};

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
      continue;
    }
    out += c;
  }
  out += '"';
}

// The raw JSON text of a value, pointing into the input.
simdjson::error_code raw_json(od::value value, std::string_view& raw) {
  od::json_type type;
  if (auto error = value.type().get(type)) return error;
  if (type == od::json_type::object) {
    od::object o;
    if (auto error = value.get_object().get(o)) return error;
    return o.raw_json().get(raw);
  }
  if (type == od::json_type::array) {
    od::array a;
    if (auto error = value.get_array().get(a)) return error;
    return a.raw_json().get(raw);
  }
  raw = value.raw_json_token();
  return simdjson::SUCCESS;
}

void append_member(std::string& out, std::string_view key, std::string_view raw) {
  if (out.size() > 1) out += ',';
  append_json_string(out, key);
  out += ':';
  out += raw;
}

Sections read_sections(const JsonReader& r, od::parser& parser, simdjson::padded_string_view json,
                       TokenizerData& data) {
  const std::string& origin = r.origin();
  const auto invalid = [&](simdjson::error_code error) {
    throw Error(fmt::format("{}: not valid JSON: {}", origin, simdjson::error_message(error)));
  };
  Sections sections;
  od::document doc;
  if (auto error = parser.iterate(json).get(doc)) invalid(error);
  od::object top;
  if (auto error = doc.get_object().get(top)) {
    if (error == simdjson::INCORRECT_TYPE) throw Error(fmt::format("{}: expected a JSON object at the top level", origin));
    invalid(error);
  }
  sections.rest.push_back('{');  // (not = "{": GCC 12 warns falsely about that)
  for (auto field : top) {
    std::string_view key, raw;
    od::value value;
    if (auto error = field.unescaped_key().get(key)) invalid(error);
    if (auto error = field.value().get(value)) invalid(error);
    if (key != "model") {
      if (auto error = raw_json(value, raw)) invalid(error);
      append_member(sections.rest, key, raw);
      continue;
    }
    sections.has_model = true;
    od::object model;
    if (value.get_object().get(model)) throw Error(fmt::format("{}: model: expected an object", origin));
    std::string model_rest = "{";
    bool other_kind = false;
    for (auto model_field : model) {
      std::string_view model_key, model_raw;
      od::value model_value;
      if (auto error = model_field.unescaped_key().get(model_key)) invalid(error);
      if (auto error = model_field.value().get(model_value)) invalid(error);
      if (model_key == "type") {
        // Noted as soon as met (Gemma's file has it first), so that a model of another kind is
        // not read as BPE tables; load_tokenizer_json then reports the kind by name.
        std::string_view type;
        if (model_value.get_string().get(type)) r.fail("model.type", "expected a string");
        other_kind = type != "BPE";
        std::string quoted;
        append_json_string(quoted, type);
        append_member(model_rest, "type", quoted);
      } else if (model_key == "vocab" && !other_kind) {
        od::object vocab;
        if (model_value.get_object().get(vocab)) r.fail("model.vocab", "expected an object");
        load_vocab(r, vocab, data);
        sections.has_vocab = true;
      } else if (model_key == "merges" && sections.has_vocab && !other_kind) {
        od::array merges;
        if (model_value.get_array().get(merges)) r.fail("model.merges", "expected an array");
        load_merges(r, merges, data);
        sections.has_merges = true;
      } else {
        if (auto error = raw_json(model_value, model_raw)) invalid(error);
        if (model_key == "merges") {
          sections.late_merges = model_raw;  // merges need the vocabulary: read them afterwards
          sections.has_merges = true;
        } else {
          append_member(model_rest, model_key, model_raw);
        }
      }
    }
    model_rest += '}';
    append_member(sections.rest, "model", model_rest);
  }
  sections.rest += '}';
  // On-Demand stops reading at the object's end; a cheap look at the end of the text catches
  // files cut short or followed by something else.
  std::string_view text(json.data(), json.size());
  const size_t last = text.find_last_not_of(" \t\r\n");
  if (last == std::string_view::npos || text[last] != '}')
    throw Error(fmt::format("{}: not valid JSON: the top-level object does not end the file", origin));
  return sections;
}

// A view of `part` of the input that may be parsed on its own: the input's padding follows it.
simdjson::padded_string_view sub_view(simdjson::padded_string_view whole, std::string_view part) {
  const size_t end = static_cast<size_t>(part.data() - whole.data()) + part.size();
  return simdjson::padded_string_view(part.data(), part.size(), part.size() + (whole.capacity() - end));
}

// Merges found before the vocabulary (unusual, but JSON objects are unordered).
void load_late_merges(const JsonReader& r, od::parser& parser, simdjson::padded_string_view json,
                      std::string_view raw, TokenizerData& data) {
  od::document doc;
  od::array merges;
  if (parser.iterate(sub_view(json, raw)).get(doc) || doc.get_array().get(merges))
    r.fail("model.merges", "expected an array");
  load_merges(r, merges, data);
}

}  // namespace

std::shared_ptr<const TokenizerData> load_tokenizer_json(simdjson::padded_string_view json, const std::string& origin) {
  auto data = std::make_shared<TokenizerData>();
  data->origin = origin;
  const JsonReader r(data->origin);

  od::parser parser;
  const Sections sections = read_sections(r, parser, json, *data);
  if (!sections.has_model) r.fail("model", "missing: the file has no tokenizer model");

  simdjson::dom::parser dom_parser;
  simdjson::dom::element root;
  if (auto error = dom_parser.parse(sections.rest).get(root))
    throw Error(fmt::format("{}: not valid JSON: {}", origin, simdjson::error_message(error)));
  const JsonReader::Object top = r.object(root, "the top level");
  const JsonReader::Object model = r.object(r.required(top, "model", "the top level"), "model");
  check_model_kind(r, model);
  if (!sections.has_vocab) r.fail("model", "missing \"vocab\"");
  if (!sections.has_merges) r.fail("model", "missing \"merges\"");
  if (sections.late_merges) load_late_merges(r, parser, json, *sections.late_merges, *data);
  load_bpe_options(r, model, *data);

  // Added tokens are matched in normalized text when so marked, so the normalizer comes first.
  if (auto normalizer = JsonReader::member(top, "normalizer")) load_normalizer(r, *normalizer, *data);
  if (auto added = JsonReader::member(top, "added_tokens"))
    load_added_tokens(r, r.array(*added, "added_tokens"), *data);
  else
    data->special.assign(static_cast<size_t>(data->tokens.size()), 0);
  if (auto pre_tokenizer = JsonReader::member(top, "pre_tokenizer")) load_pre_tokenizer(r, *pre_tokenizer, *data);
  load_decoder(r, JsonReader::member(top, "decoder"), *data);
  const auto post_processor = JsonReader::member(top, "post_processor");
  if (post_processor) load_post_processor(r, *post_processor, *data);

  const auto bos = data->template_prefix.empty() ? data->tokens.find("<bos>")
                                                  : std::optional<int32_t>(data->template_prefix.front());
  if (!bos) r.fail("post_processor", "no BOS token: neither a template starting with a special token nor \"<bos>\"");
  data->bos_id = *bos;
  if (!post_processor) data->template_prefix = {*bos};  // add_bos without a template: <bos> in front
  return data;
}

}  // namespace tandem::tok
