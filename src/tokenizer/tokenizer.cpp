#include "tokenizer/tokenizer.h"

#include <unistd.h>

#include "core/error.h"
#include "core/mapped_file.h"
#include "tokenizer/load_stages.h"
#include "tokenizer/tokenizer_data.h"
#include "tokenizer/utf8.h"

namespace tandem {

Tokenizer Tokenizer::from_file(const std::string& path) {
  const MappedFile file(path);  // throws Error naming the file (missing, unreadable, a directory)
  if (file.size() == 0) fail("tokenizer file {} is empty", path);
  // Mapping beats reading by far (no copy, no fresh pages), but simdjson reads up to
  // SIMDJSON_PADDING bytes past the end: fine within the zero-filled tail of the last page, and
  // when the file ends too close to a page boundary we copy it into a padded buffer instead.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t tail = file.size() % page;
  const auto* text = reinterpret_cast<const char*>(file.data());
  if (tail != 0 && tail + simdjson::SIMDJSON_PADDING <= page) {
    file.advise_sequential();
    return Tokenizer(tok::load_tokenizer_json(
        simdjson::padded_string_view(text, file.size(), file.size() - tail + page), path));
  }
  const simdjson::padded_string copy(text, file.size());
  return Tokenizer(tok::load_tokenizer_json(copy, path));
}

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& origin) {
  const simdjson::padded_string copy(json);
  return Tokenizer(tok::load_tokenizer_json(copy, origin));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (add_bos) ids.insert(ids.end(), data_->template_prefix.begin(), data_->template_prefix.end());
  if (utf8::is_valid(text)) {
    data_->encode(text, ids);
  } else {
    data_->encode(utf8::make_valid(text), ids);
  }
  if (add_bos) ids.insert(ids.end(), data_->template_suffix.begin(), data_->template_suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, DecodeOptions options) const {
  std::string text, pending;
  text.reserve(ids.size() * 4);
  for (int32_t id : ids) data_->decode_step(id, options.skip_special_tokens, pending, text);
  tok::TokenizerData::decode_finish(pending, text);
  return text;
}

int32_t Tokenizer::vocab_size() const { return data_->tokens.size(); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const { return data_->tokens.find(token); }

std::string_view Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    fail("token id {} is out of range (the vocabulary has ids 0 to {})", id, vocab_size() - 1);
  return data_->tokens.text(id).value_or(std::string_view{});
}

int32_t Tokenizer::bos_id() const { return data_->bos_id; }

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && data_->special[id] != 0;
}

IncrementalDecoder::IncrementalDecoder(Tokenizer tokenizer, DecodeOptions options)
    : tokenizer_(std::move(tokenizer)), options_(options) {}

void IncrementalDecoder::push(int32_t id, std::string& out) {
  tokenizer_.data_->decode_step(id, options_.skip_special_tokens, pending_, out);
}

std::string IncrementalDecoder::push(int32_t id) {
  std::string out;
  push(id, out);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  tok::TokenizerData::decode_finish(pending_, out);
  return out;
}

}  // namespace tandem
