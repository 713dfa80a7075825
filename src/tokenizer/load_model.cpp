// Reads tokenizer.json's "model" (BPE). The vocabulary and merges are nearly all of the file, so
// they are read with simdjson On-Demand straight from the file's bytes; the few options come from
// the DOM of the small remainder (see load_tokenizer.cpp).
#include <climits>
#include <string>
#include <vector>

#include "tokenizer/json_reader.h"
#include "tokenizer/load_stages.h"
#include "tokenizer/utf8.h"

namespace tandem::tok {

namespace {

constexpr std::string_view kWordStartUtf8 = "\xE2\x96\x81";  // U+2581 "▁"

// A token that is exactly one code point, or -1.
int64_t single_code_point(std::string_view token) {
  if (token.empty()) return -1;
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  const int length = utf8::sequence_length(p[0]);
  return static_cast<size_t>(length) == token.size() ? utf8::decode_valid(p, length) : -1;
}

// Records each character that some token has right before "▁" (see BpeModel::encode_word).
void note_glue_before_word_start(std::string_view token, BpeModel& bpe) {
  for (size_t at = token.find(kWordStartUtf8, 1); at != std::string_view::npos;
       at = token.find(kWordStartUtf8, at + 1)) {
    size_t start = at - 1;
    while (start > 0 && (static_cast<unsigned char>(token[start]) & 0xC0) == 0x80) --start;
    const auto* p = reinterpret_cast<const unsigned char*>(token.data() + start);
    const uint32_t previous = utf8::decode_valid(p, utf8::sequence_length(*p));
    if (previous != 0x2581) bpe.add_glue_before_word_start(previous);
  }
}

// Lookups into the token and merge tables are cache misses (tens of MB, random order). Loading
// hashes a batch of entries and prefetches their slots before touching any, so the misses overlap.
constexpr size_t kBatch = 64;

}  // namespace

void load_vocab(const JsonReader& r, simdjson::ondemand::object vocab, TokenizerData& data) {
  size_t count = 0;
  if (vocab.count_fields().get(count)) r.fail("model.vocab", "not valid JSON");
  if (count == 0) r.fail("model.vocab", "the vocabulary is empty");
  data.tokens.reserve(count + 1024, count * 8);

  struct Entry {
    std::string_view text;
    int32_t id;
    uint64_t hash;
  };
  std::vector<Entry> batch;
  batch.reserve(kBatch);
  const auto flush = [&] {
    for (const Entry& e : batch) {
      if (const auto other = data.tokens.text(e.id))
        r.fail("model.vocab", "tokens \"{}\" and \"{}\" have the same id {}", *other, e.text, e.id);
      data.tokens.set(e.id, e.text, e.hash);
      if (const int64_t cp = single_code_point(e.text); cp >= 0) data.bpe.chars.set(static_cast<uint32_t>(cp), e.id);
      // Byte fallback looks tokens up by the spelling "<0x%02X>" (upper case).
      if (const int b = byte_token_value(e.text, /*lower_case_too=*/false); b >= 0) data.bpe.byte_tokens[b] = e.id;
      note_glue_before_word_start(e.text, data.bpe);
    }
    batch.clear();
  };
  for (auto field : vocab) {
    std::string_view text;
    if (field.unescaped_key().get(text)) r.fail("model.vocab", "not valid JSON");
    int64_t id = -1;
    if (field.value().get_int64().get(id) || id < 0 || id >= INT32_MAX)
      r.fail("model.vocab", "token \"{}\" does not have a valid id", text);
    if (id >= kMaxTokenId)
      r.fail("model.vocab", "token \"{}\" has id {}, beyond any vocabulary (at most {})", text, id, kMaxTokenId - 1);
    batch.push_back(Entry{text, static_cast<int32_t>(id), hash_bytes(text)});
    data.tokens.prefetch(batch.back().hash);
    if (batch.size() == kBatch) flush();
  }
  flush();
}

namespace {

// One merge: "left right" (older files) or ["left", "right"] (newer files).
bool read_merge(simdjson::ondemand::value merge, std::string_view& left, std::string_view& right) {
  simdjson::ondemand::json_type type;
  if (merge.type().get(type)) return false;
  if (type == simdjson::ondemand::json_type::string) {
    std::string_view text;
    if (merge.get_string().get(text)) return false;
    const size_t space = text.find(' ');
    if (space == std::string_view::npos || text.find(' ', space + 1) != std::string_view::npos) return false;
    left = text.substr(0, space);
    right = text.substr(space + 1);
    return true;
  }
  if (type != simdjson::ondemand::json_type::array) return false;
  simdjson::ondemand::array pair;
  if (merge.get_array().get(pair)) return false;
  size_t n = 0;
  for (auto part : pair) {
    std::string_view text;
    if (n >= 2 || part.get_string().get(text)) return false;
    (n++ == 0 ? left : right) = text;
  }
  return n == 2;
}

}  // namespace

void load_merges(const JsonReader& r, simdjson::ondemand::array merges, TokenizerData& data) {
  size_t total = 0;
  if (merges.count_elements().get(total)) r.fail("model.merges", "not valid JSON");
  data.bpe.merges.reserve(total);

  struct Pending {
    std::string_view part[3];  // left, right, merged
    uint64_t hash[3];
    int32_t id[3];
  };
  std::vector<Pending> batch(kBatch);
  std::vector<size_t> merged_offsets(kBatch);
  std::string merged_text;  // the merged spellings of one batch, back to back
  size_t count = 0;
  size_t rank = 0;  // of the first merge in the batch
  const auto flush = [&] {
    for (size_t i = 0; i < count; ++i) {
      Pending& m = batch[i];
      m.part[2] = std::string_view(merged_text).substr(merged_offsets[i], m.part[0].size() + m.part[1].size());
      for (int k = 0; k < 3; ++k) {
        m.hash[k] = hash_bytes(m.part[k]);
        data.tokens.prefetch(m.hash[k]);
      }
    }
    for (size_t i = 0; i < count; ++i) {
      Pending& m = batch[i];
      for (int k = 0; k < 3; ++k) {
        const auto id = data.tokens.find(m.part[k], m.hash[k]);
        if (!id) r.fail(fmt::format("model.merges[{}]", rank + i), "\"{}\" is not in the vocabulary", m.part[k]);
        m.id[k] = *id;
      }
      data.bpe.merges.prefetch(m.id[0], m.id[1]);
    }
    for (size_t i = 0; i < count; ++i)
      data.bpe.merges.insert(batch[i].id[0], batch[i].id[1], Merge{static_cast<int32_t>(rank + i), batch[i].id[2]});
    rank += count;
    count = 0;
    merged_text.clear();
  };

  for (auto element : merges) {
    simdjson::ondemand::value merge;
    Pending& m = batch[count];
    if (element.get(merge) || !read_merge(merge, m.part[0], m.part[1]))
      r.fail(fmt::format("model.merges[{}]", rank + count), "expected \"left right\" or [\"left\", \"right\"]");
    merged_offsets[count] = merged_text.size();
    merged_text.append(m.part[0]).append(m.part[1]);
    if (++count == kBatch) flush();
  }
  flush();
}

void check_model_kind(const JsonReader& r, JsonReader::Object model) {
  if (auto type = JsonReader::member(model, "type")) {
    const std::string_view name = r.string(*type, "model.type");
    if (name != "BPE") r.fail("model.type", "unsupported model type \"{}\" (only BPE is supported)", name);
  }
  if (auto dropout = JsonReader::member(model, "dropout")) {
    double p = 0;
    if (dropout->get_double().get(p) || p != 0.0) r.fail("model.dropout", "BPE dropout is not supported");
  }
  for (std::string_view affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (auto e = JsonReader::member(model, affix); e && !r.string(*e, fmt::format("model.{}", affix)).empty())
      r.fail(fmt::format("model.{}", affix), "subword affixes are not supported");
}

void load_bpe_options(const JsonReader& r, JsonReader::Object model, TokenizerData& data) {
  BpeOptions& options = data.bpe.options;
  options.byte_fallback = r.flag(model, "byte_fallback", false, "model");
  options.fuse_unk = r.flag(model, "fuse_unk", false, "model");
  options.ignore_merges = r.flag(model, "ignore_merges", false, "model");
  if (auto unk = JsonReader::member(model, "unk_token")) {
    const std::string_view text = r.string(*unk, "model.unk_token");
    const auto id = data.tokens.find(text);
    if (!id) r.fail("model.unk_token", "\"{}\" is not in the vocabulary", text);
    options.unk_id = *id;
  }
}

}  // namespace tandem::tok
