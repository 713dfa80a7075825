// The cost of holding output to JSON or to tool calls: one mask() over Gemma's 262144-token
// vocabulary (what each draw of such a request adds on the sampling pool), at points of the output
// where the mask reads the most tokens:
//   JsonMask/object_key        json_object, inside a key ("{\"na")
//   JsonMask/object_value      json_object, where a value begins ("{\"name\": ")
//   JsonMask/schema_enum       json_schema, where a property's 40-value enum begins
//   JsonMask/schema_string     json_schema, inside a string with maxLength
//   JsonMask/tool_argument     a forced tool call, inside a string argument
//   JsonMask/thought           a forced tool call, inside the thought before it
// Run: TANDEM_TOKENIZER=build/test-cache/gemma4-tokenizer-*.json build/bench/json_mask_bench
#include <benchmark/benchmark.h>

#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "runtime/json_output.h"
#include "server/json_schema.h"
#include "server/served_model.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace tandem;

std::shared_ptr<const TokenBytes> vocabulary() {
  static const std::shared_ptr<const TokenBytes> bytes = [] () -> std::shared_ptr<const TokenBytes> {
    const char* path = std::getenv("TANDEM_TOKENIZER");
    if (!path) return nullptr;
    return server::output_token_bytes(Tokenizer::from_file(path));
  }();
  return bytes;
}

// The byte a control token stands for, in the prefixes below.
std::string with_controls(std::string text) {
  const std::pair<std::string, unsigned char> controls[] = {{"<|\"|>", kGemmaQuoteByte},
                                                            {"<|tool_call>", kToolCallOpenByte},
                                                            {"<|channel>", kChannelOpenByte}};
  for (const auto& [marker, byte] : controls)
    for (size_t at = 0; (at = text.find(marker, at)) != std::string::npos;) text.replace(at, marker.size(), 1, char(byte));
  return text;
}

void run_mask(benchmark::State& state, std::shared_ptr<const JsonGrammar> grammar, const std::string& prefix) {
  const auto bytes = vocabulary();
  if (!bytes) return state.SkipWithError("set TANDEM_TOKENIZER to a Gemma tokenizer.json");
  JsonOutputConstraint constraint(bytes, {1, 106, 50}, grammar);
  // The prefix as byte tokens (each byte-fallback token's byte), read as accept() reads a draw.
  std::vector<int32_t> byte_token(256, -1);
  for (size_t id = 0; id < bytes->bytes.size(); ++id)
    if (bytes->bytes[id].size() == 1 && byte_token[static_cast<unsigned char>(bytes->bytes[id][0])] < 0)
      byte_token[static_cast<unsigned char>(bytes->bytes[id][0])] = int32_t(id);
  for (char c : with_controls(prefix)) {
    const int32_t id = byte_token[static_cast<unsigned char>(c)];
    if (id < 0) return state.SkipWithError("a byte of the prefix has no token");
    constraint.accept(id);
  }
  std::vector<float> logits(bytes->bytes.size());
  size_t allowed = 0;
  for (auto _ : state) {
    std::fill(logits.begin(), logits.end(), 0.0f);
    constraint.mask(logits);
    benchmark::DoNotOptimize(logits.data());
  }
  for (float l : logits) allowed += l == 0.0f;
  state.counters["allowed"] = double(allowed);
}

std::shared_ptr<const JsonGrammar> schema(const std::string& text) {
  return server::compile_json_schema(nlohmann::ordered_json::parse(text), "schema");
}

void BM_ObjectKey(benchmark::State& state) { run_mask(state, nullptr, "{\"na"); }
void BM_ObjectValue(benchmark::State& state) { run_mask(state, nullptr, "{\"name\": "); }

void BM_SchemaEnum(benchmark::State& state) {
  std::string values;
  for (int i = 0; i < 40; ++i) values += fmt::format("{}\"value {}\"", i ? "," : "", i);
  run_mask(state, schema(R"({"type": "object", "properties": {"kind": {"enum": [)" + values + "]}}, \"required\": [\"kind\"]}"),
           "{\"kind\": ");
}

void BM_SchemaString(benchmark::State& state) {
  run_mask(state, schema(R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}}})"),
           "{\"name\": \"Ada ");
}

const nlohmann::json kTools = nlohmann::json::parse(R"([{"type": "function", "function": {"name": "search",
  "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}])");

void BM_ToolArgument(benchmark::State& state) {
  run_mask(state, server::compile_tool_calls(kTools, nullptr, ToolCallGrammar::Thought::Optional),
           "<|tool_call>call:search{query:<|\"|>weather in ");
}

void BM_Thought(benchmark::State& state) {
  run_mask(state, server::compile_tool_calls(kTools, nullptr, ToolCallGrammar::Thought::Optional),
           "<|channel>thought\nThe user wants ");
}

BENCHMARK(BM_ObjectKey)->Name("JsonMask/object_key")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ObjectValue)->Name("JsonMask/object_value")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaEnum)->Name("JsonMask/schema_enum")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_SchemaString)->Name("JsonMask/schema_string")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_ToolArgument)->Name("JsonMask/tool_argument")->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Thought)->Name("JsonMask/thought")->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
