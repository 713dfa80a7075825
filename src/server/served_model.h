#pragma once
// What `tandem serve` hands the HTTP layer once the model is loaded: the engine that generates, the
// tokenizer, the served name and the generation defaults from the checkpoint. The server reaches the
// model only through these (it never sees tensors).
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/json_output.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

// The byte a byte-fallback token ("<0x0A>") stands for; nullopt for any other token text.
std::optional<unsigned char> byte_fallback_value(std::string_view piece);

// The bytes each token adds to a generation's output (its decoded text; a byte-fallback token its one
// byte; nothing for special tokens), for constraints that check output bytes (response_format).
std::shared_ptr<const TokenBytes> output_token_bytes(const Tokenizer& tokenizer);

struct ServedModel {
  Engine& engine;
  Tokenizer tokenizer;
  std::string name;                     // the model id clients send and /v1/models lists
  std::vector<int32_t> stop_token_ids;  // generation_config.json's eos_token_id
  SamplingParams default_sampling;      // generation_config.json's temperature, top_k, top_p, ...
  int64_t created = std::time(nullptr);
  std::shared_ptr<const TokenBytes> token_bytes = output_token_bytes(tokenizer);  // for JSON output
};

}  // namespace tandem::server
