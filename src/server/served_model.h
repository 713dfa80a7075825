#pragma once
// What `tandem serve` hands the HTTP layer once the model is loaded: the engine that generates, the
// tokenizer, the served name and the generation defaults from the checkpoint. The server reaches the
// model only through these (it never sees tensors).
#include <cstdint>
#include <ctime>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace tandem::server {

struct ServedModel {
  Engine& engine;
  Tokenizer tokenizer;
  std::string name;                     // the model id clients send and /v1/models lists
  std::vector<int32_t> stop_token_ids;  // generation_config.json's eos_token_id
  SamplingParams default_sampling;      // generation_config.json's temperature, top_k, top_p, ...
  int64_t created = std::time(nullptr);
};

}  // namespace tandem::server
