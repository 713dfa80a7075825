#pragma once
// The stages of loading tokenizer.json, one per top-level section. Each throws Error naming the
// file and the JSON path of what it cannot read or does not support.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/json_reader.h"
#include "tokenizer/tokenizer_data.h"

namespace tandem::tok {

// The whole file, `json` followed by at least SIMDJSON_PADDING readable bytes; throws Error naming
// `origin` and what is wrong.
std::shared_ptr<const TokenizerData> load_tokenizer_json(simdjson::padded_string_view json, const std::string& origin);

// Tables are indexed by id, so an id far beyond any vocabulary (a corrupt file: "zzz": 1000000000)
// would allocate gigabytes before anything else was checked: ids above this are refused.
constexpr int64_t kMaxTokenId = int64_t(1) << 24;

// model.vocab and model.merges (in that order), read On-Demand.
void load_vocab(const JsonReader& r, simdjson::ondemand::object vocab, TokenizerData& data);
void load_merges(const JsonReader& r, simdjson::ondemand::array merges, TokenizerData& data);
// The model's type and the features we refuse (dropout, subword affixes).
void check_model_kind(const JsonReader& r, JsonReader::Object model);
// The rest of "model" (options); needs the vocabulary.
void load_bpe_options(const JsonReader& r, JsonReader::Object model, TokenizerData& data);
// Needs the normalizer (normalized added tokens are matched in their normalized spelling).
void load_added_tokens(const JsonReader& r, JsonReader::Array added, TokenizerData& data);
void load_normalizer(const JsonReader& r, JsonReader::Element normalizer, TokenizerData& data);
void load_pre_tokenizer(const JsonReader& r, JsonReader::Element pre_tokenizer, TokenizerData& data);
// Needs every token (model and added): it precomputes each token's decoded text.
void load_decoder(const JsonReader& r, std::optional<JsonReader::Element> decoder, TokenizerData& data);
void load_post_processor(const JsonReader& r, JsonReader::Element post_processor, TokenizerData& data);

// "<0x41>" -> 0x41, else -1.
int byte_token_value(std::string_view token, bool lower_case_too);

}  // namespace tandem::tok
