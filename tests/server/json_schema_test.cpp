// JSON Schemas compiled (server/json_schema) and output read against them (runtime/json_output):
// documents a JSON Schema validator accepts or refuses, read byte by byte; and, from every prefix a
// random walk reaches, some byte always goes on unless the value is complete (the mask never
// strands the output).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <random>
#include <string>

#include <fmt/format.h>

#include "runtime/json_output.h"
#include "server/api_error.h"
#include "server/json_schema.h"

namespace tandem::server {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

std::shared_ptr<const JsonGrammar> compile(const std::string& schema) {
  return compile_json_schema(ordered_json::parse(schema), "schema");
}

// How far `text` gets: the bytes read before the first refused one, and whether it ends complete.
std::pair<size_t, bool> read(const JsonGrammar& grammar, const std::string& text) {
  JsonPrefix p(grammar);
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.feed(static_cast<unsigned char>(text[i]))) return {i, false};
  return {text.size(), p.complete()};
}

struct Case {
  std::string text;
  bool valid;
  size_t refused_at = std::string::npos;  // for invalid ones: where, when it is not at the end
};

void expect_reads(const std::string& schema, const std::vector<Case>& cases) {
  SCOPED_TRACE(schema);
  const auto grammar = compile(schema);
  for (const Case& c : cases) {
    const auto [at, complete] = read(*grammar, c.text);
    if (c.valid) {
      EXPECT_TRUE(at == c.text.size() && complete) << c.text << ": refused at " << at;
    } else {
      EXPECT_FALSE(at == c.text.size() && complete) << c.text << " was taken";
      if (c.refused_at != std::string::npos) {
        EXPECT_EQ(at, c.refused_at) << c.text;
      }
    }
  }
}

TEST(JsonSchema, ObjectsWritePropertiesInTheSchemasOrderAndTheRequiredOnes) {
  expect_reads(R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age"],
                   "additionalProperties": false})",
               {{R"({"name":"Ada","age":36})", true},
                {"{ \"name\" : \"Ada\" ,\n  \"age\": 36, \"tags\": [\"x\", \"y\"] }", true},
                {R"({"age":36,"name":"Ada"})", false, 2},  // (name first, as the schema has it)
                {R"({"name":"Ada"})", false, 13},
                {R"({})", false, 1},
                {R"({"name":"Ada","age":"36"})", false, 20},
                {R"({"name":"Ada","age":36.5})", false, 22},
                {R"({"name":"Ada","age":36,"extra":1})", false, 24},
                {R"({"name":"Ada","age":36,"tags":[1]})", false, 31}});
  // Keys are matched as the schema writes them, escapes included.
  expect_reads(R"({"type": "object", "properties": {"a\"b": {"const": 1}, "ab": {"const": 2}}})",
               {{R"({"a\"b":1,"ab":2})", true}, {R"({"ab":2})", true}, {R"({"ab":2,"a\"b":1})", false, 7}});
}

TEST(JsonSchema, AdditionalPropertiesTakeAnyKeyWithTheirSchema) {
  expect_reads(R"({"type": "object", "additionalProperties": {"type": "integer"}})",
               {{R"({"x":1,"y é":-2})", true}, {R"({})", true}, {R"({"x":"1"})", false, 5}});
  expect_reads(R"({"type": "object", "additionalProperties": false})", {{R"({})", true}, {R"({"x":1})", false, 1}});
}

TEST(JsonSchema, ChoicesEnumsAndConsts) {
  expect_reads(R"({"anyOf": [{"type": "string"}, {"type": "null"}]})",
               {{R"("x")", true}, {"null", true}, {"1", false, 0}, {"nul", false}});
  expect_reads(R"({"enum": ["red", "green", 3, 35, null, {"a": [1]}]})",
               {{R"("red")", true}, {R"("green")", true}, {"3", true}, {"35", true}, {"null", true},
                {R"({"a":[1]})", true}, {R"("blue")", false, 1}, {"30", false, 1}, {R"("re")", false},
                {R"({"a": [1]})", false, 5}});
  expect_reads(R"({"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
                   "required": ["kind", "r"]})",
               {{R"({"kind":"circle","r":2.5e-1})", true}, {R"({"kind":"square","r":1})", false, 9}});
  // oneOf reads as anyOf; type lists and nullable widen the types.
  expect_reads(R"({"oneOf": [{"type": "integer"}, {"type": "boolean"}]})", {{"12", true}, {"true", true}, {"\"\"", false, 0}});
  expect_reads(R"({"type": ["integer", "null"]})", {{"-7", true}, {"null", true}, {"1.5", false, 1}});
  expect_reads(R"({"type": "string", "nullable": true})", {{"null", true}, {"\"a\"", true}});
}

TEST(JsonSchema, ArraysAndStringsKeepTheirLengths) {
  expect_reads(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2})",
               {{"[1]", true}, {"[1, 2]", true}, {"[]", false, 1}, {"[1,2,3]", false, 4}, {"[1,\"2\"]", false, 3}});
  // Characters, not bytes: an escape is one, a surrogate pair of escapes one.
  expect_reads(R"({"type": "string", "minLength": 2, "maxLength": 3})",
               {{R"("ab")", true}, {"\"é日\"", true}, {R"("\u00e9\uD83D\uDE00x")", true}, {R"("\n\t")", true},
                {R"("a")", false, 2}, {R"("abcd")", false, 4}, {R"("ab\n\t")", false, 5}});
}

TEST(JsonSchema, NumbersStayWithinTheirBounds) {
  expect_reads(R"({"type": "integer", "minimum": 10, "maximum": 20})",
               {{"10", true}, {"15", true}, {"20", true}, {"1", false}, {"5", false, 0}, {"21", false, 1},
                {"200", false, 2}, {"-1", false, 0}, {"15.0", false, 2}});
  expect_reads(R"({"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 0})",
               {{"-2", true}, {"-1", true}, {"-3", false, 1}, {"0", false, 0}, {"-0", false}});
  expect_reads(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1})",
               {{"0.5", true}, {"1", true}, {"1.0", true}, {"0.000000000000001", true}, {"0", false},
                {"0.0", false}, {"1.5", false, 2}, {"1e0", false, 1}, {"0.0000000000000001", false, 16},
                {"-0.5", false, 0}});
  // Draft 4's boolean exclusive bounds; a lower bound of 0.1 (a double a little above a tenth).
  expect_reads(R"({"type": "number", "minimum": 0.1, "maximum": 2, "exclusiveMaximum": true})",
               {{"0.1", true}, {"1.99", true}, {"0.09", false, 2}, {"2", false}});
  expect_reads(R"({"type": "integer", "maximum": -5})", {{"-5", true}, {"-123456", true}, {"5", false, 0}, {"-4", false}, {"-4.5", false, 2}});
}

TEST(JsonSchema, ReferencesReachDefinitionsAndRecurse) {
  expect_reads(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v", "kids"]}},
                   "$ref": "#/$defs/node"})",
               {{R"({"v":1,"kids":[{"v":2,"kids":[]},{"v":3,"kids":[{"v":4,"kids":[]}]}]})", true},
                {R"({"v":1,"kids":[{"v":2}]})", false, 21}});
  // Pydantic's shapes: a nested model by $ref under allOf, an Optional field as anyOf with null.
  expect_reads(R"({"definitions": {"Pet": {"title": "Pet", "type": "object", "properties": {"name": {"title": "Name",
                     "type": "string"}}, "required": ["name"]}}, "title": "Owner", "type": "object", "properties": {
                     "pet": {"allOf": [{"$ref": "#/definitions/Pet"}], "description": "the pet"},
                     "age": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": null}},
                   "required": ["pet"]})",
               {{R"({"pet":{"name":"Rex"},"age":null})", true}, {R"({"pet":{"name":"Rex"},"age":3})", true},
                {R"({"pet":{}})", false, 8}});
}

TEST(JsonSchema, ChoicesThatLeadNowhereAreCutOut) {
  // An optional property no value can satisfy is never begun; nor is an item of an impossible array.
  expect_reads(R"({"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 4},
                   "b": {"type": "boolean"}}})",
               {{R"({"b":true})", true}, {R"({"a":1})", false, 2}});
  expect_reads(R"({"type": "array", "items": false})", {{"[]", true}, {"[1]", false, 1}});
  expect_reads(R"({"anyOf": [{"type": "string", "minLength": 3, "maxLength": 1}, {"type": "integer"}]})",
               {{"7", true}, {"\"", false, 0}});
}

TEST(JsonSchema, WhatCannotBeHeldIsRefusedByName) {
  const auto refusal = [](const std::string& schema) -> std::string {
    try {
      compile(schema);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "response_format");
      return e.what();
    }
    return "accepted";
  };
  EXPECT_THAT(refusal(R"({"type": "string", "pattern": "^a+$"})"), HasSubstr("'pattern' is not supported"));
  EXPECT_THAT(refusal(R"({"properties": {"x": {"type": "integer", "multipleOf": 3}}})"),
              HasSubstr("schema#/properties/x: 'multipleOf'"));
  EXPECT_THAT(refusal(R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})"), HasSubstr("'allOf' of more than one"));
  EXPECT_THAT(refusal(R"({"$ref": "#/$defs/missing"})"), HasSubstr("points nowhere"));
  EXPECT_THAT(refusal(R"({"$ref": "https://example.com/schema.json"})"), HasSubstr("into the schema itself"));
  EXPECT_THAT(refusal(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})"),
              HasSubstr("required property \"b\""));
  EXPECT_THAT(refusal(R"({"type": "integer", "minimum": 5, "maximum": 4})"), HasSubstr("lies within the bounds"));
  EXPECT_THAT(refusal(R"({"type": "number", "minimum": 1e-18, "maximum": 1e-18})"), HasSubstr("15 fraction digits"));
  // No double lies strictly between these two, so no number a reader takes in does.
  EXPECT_THAT(refusal(R"({"type": "number", "exclusiveMinimum": 99.99999999999999, "exclusiveMaximum": 100})"),
              HasSubstr("lies within the bounds"));
  EXPECT_THAT(refusal(R"({"type": "integer", "enum": [100], "maximum": 3})"), HasSubstr("'maximum' beside 'enum'"));
  EXPECT_THAT(refusal(R"({"enum": ["a"], "const": "c"})"), HasSubstr("together"));
  EXPECT_THAT(refusal(R"({"type": "string", "nullable": "yes"})"), HasSubstr("'nullable' must be a boolean"));
  std::string chain = R"({"$defs": {)";
  for (int i = 0; i < 4000; ++i) chain += fmt::format(R"("d{}": {{"anyOf": [{{"$ref": "#/$defs/d{}"}}, {{"type": "null"}}]}},)", i, i + 1);
  chain += R"("d4000": {"type": "integer"}}, "$ref": "#/$defs/d0"})";
  EXPECT_THAT(refusal(chain), HasSubstr("deeper than 256 levels"));
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "object", "properties": {"a": )" + deep + R"(}, "required": ["a"]})";
  EXPECT_THAT(refusal(deep), HasSubstr("deeper than 64 levels"));
  std::string wide = R"({"anyOf": [)";
  for (int i = 0; i < 129; ++i) wide += fmt::format(R"({}{{"type": "object", "properties": {{"k{}": {{}}}}}})", i ? "," : "", i);
  EXPECT_THAT(refusal(wide + "]}"), HasSubstr("too many choices"));
  EXPECT_THAT(refusal(R"({"type": "array", "items": [{"type": "integer"}]})"), HasSubstr("tuple"));
  EXPECT_THAT(refusal(R"({"type": "text"})"), HasSubstr("not a JSON Schema type"));
  EXPECT_THAT(refusal(R"({"anyOf": [{"type": "integer"}], "minimum": 3})"), HasSubstr("'minimum' beside 'anyOf'"));
  EXPECT_THAT(refusal(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"), HasSubstr("allows no value"));
  EXPECT_EQ(refusal(R"({"type": "string", "format": "date", "title": "t", "uniqueItems": false})"), "accepted");
}

// Choices nested any way cost one level when reading: 7 levels of anyOf over 16 refs each (16^7 ways
// followed naively), a left recursion, and a chain of 40 refs.
TEST(JsonSchema, NestedChoicesAreResolvedWhenCompiled) {
  std::string defs;
  for (int level = 0; level < 7; ++level) {
    std::string refs;
    for (int k = 0; k < 16; ++k) refs += fmt::format(R"({}{{"$ref": "#/$defs/l{}"}})", k ? "," : "", level + 1);
    defs += fmt::format(R"("l{}": {{"anyOf": [{}]}},)", level, refs);
  }
  expect_reads(R"({"$defs": {)" + defs + R"("l7": {"type": "integer"}}, "$ref": "#/$defs/l0"})",
               {{"12", true}, {"\"a\"", false, 0}});
  expect_reads(R"({"anyOf": [{"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}, {"type": "integer"}]})", {{"-3", true}});
  std::string chain = R"({"$defs": {)";
  for (int i = 0; i < 40; ++i) chain += fmt::format(R"("r{}": {{"$ref": "#/$defs/r{}"}},)", i, i + 1);
  expect_reads(chain + R"("r40": {"type": "string"}}, "$ref": "#/$defs/r0"})", {{"\"x\"", true}});
}

// Values past the 32 ways followed at once: an enum's values are matched by their bytes, all of them.
TEST(JsonSchema, EveryValueOfALongEnumCanBeWritten) {
  std::string values;
  for (int i = 0; i < 40; ++i) values += fmt::format(R"({}"value {}")", i ? "," : "", i);
  expect_reads(R"({"enum": [)" + values + R"(]})", {{R"("value 0")", true}, {R"("value 39")", true}, {R"("value 40")", false, 8}});
  expect_reads(R"({"enum": [1, 12, 123, 2]})", {{"1", true}, {"12", true}, {"123", true}, {"2", true}, {"13", false, 1}});
}

// Bounds pass what a reader of the number passes, exact where they are written as integers; a value
// that cannot close within the 64 levels is never begun.
TEST(JsonSchema, BoundsAndDepthHoldExactly) {
  expect_reads(R"({"type": "integer", "minimum": 9223372036854775807, "maximum": 9223372036854775807})",
               {{"9223372036854775807", true}, {"9223372036854775806", false}});
  expect_reads(R"({"type": "number", "minimum": -1e-15, "maximum": -1e-18})",
               {{"-0.000000000000001", true}, {"0", false, 0}, {"-0.0000000000000001", false, 17}});
  expect_reads(R"({"type": "number", "minimum": 99.99999999999997, "exclusiveMaximum": 100})",
               {{"99.99999999999997", true}, {"99.99999999999999", true}, {"99.999999999999999", false}});
  expect_reads(R"({"type": "array", "maxItems": 18446744073709551615, "items": {"type": "integer"}})", {{"[1]", true}});
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 70; ++i) deep = R"({"type": "object", "properties": {"a": )" + deep + R"(}, "required": ["a"]})";
  expect_reads(R"({"type": "object", "properties": {"deep": )" + deep + R"(, "b": {"type": "boolean"}}})",
               {{"{}", true}, {R"({"b":true})", true}, {R"({"deep")", false, 2}});
}

// From every state a random walk reaches, a byte goes on or the value is complete: the mask can always
// offer the model a way forward, and the walk ends in a document of the schema.
TEST(JsonSchema, NoPrefixIsADeadEnd) {
  const std::vector<std::string> schemas = {
      R"({"type": "object", "properties": {"id": {"type": "integer", "minimum": -50, "maximum": 1234},
          "score": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}, "name": {"type": "string", "maxLength": 4},
          "tags": {"type": "array", "items": {"enum": ["a", "ab", "abc", 1, 12]}, "maxItems": 3},
          "ok": {"type": ["boolean", "null"]}}, "required": ["id", "score", "tags"]})",
      R"({"$defs": {"t": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
          {"type": "array", "items": {"$ref": "#/$defs/t"}, "maxItems": 2}]}}, "$ref": "#/$defs/t"})",
      R"({"type": "object", "additionalProperties": {"type": "string", "minLength": 1, "maxLength": 2}})",
      R"({"type": "integer", "minimum": 999999999999999990})",
      R"({"type": "number", "minimum": -0.25, "maximum": -0.125})"};
  std::mt19937 rng(11);
  for (const std::string& schema : schemas) {
    SCOPED_TRACE(schema);
    const auto grammar = compile(schema);
    int completed = 0;
    for (int walk = 0; walk < 200; ++walk) {
      JsonPrefix state(*grammar);
      std::string text;
      for (int step = 0; step < 400; ++step) {
        std::vector<unsigned char> next;
        for (int c = 0; c < 256; ++c) {
          JsonPrefix probe = state;
          if (probe.feed(static_cast<unsigned char>(c))) next.push_back(static_cast<unsigned char>(c));
        }
        ASSERT_TRUE(!next.empty() || state.complete()) << "stranded after " << text;
        if (next.empty() || (state.complete() && rng() % 4 == 0)) break;
        // Favour the structural bytes so that walks end.
        unsigned char c = next[rng() % next.size()];
        for (unsigned char s : next)
          if ((s == '"' || s == ']' || s == '}' || s == ',') && rng() % 3 == 0) c = s;
        ASSERT_TRUE(state.feed(c));
        text += char(c);
      }
      if (state.complete()) {
        ++completed;
        EXPECT_TRUE(nlohmann::json::accept(text)) << text;
      }
    }
    EXPECT_GT(completed, 50);
  }
}

// Tool calls in Gemma's syntax: the control tokens read as the bytes that stand for them.
std::string gemma(std::string text) {
  const std::pair<std::string, unsigned char> controls[] = {{"<|\"|>", kGemmaQuoteByte},
                                                            {"<|tool_call>", kToolCallOpenByte},
                                                            {"<tool_call|>", kToolCallCloseByte},
                                                            {"<|channel>", kChannelOpenByte},
                                                            {"<channel|>", kChannelCloseByte}};
  for (const auto& [marker, byte] : controls)
    for (size_t at = 0; (at = text.find(marker, at)) != std::string::npos;) text.replace(at, marker.size(), 1, char(byte));
  return text;
}

const nlohmann::json kTools = nlohmann::json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"unit": {"enum": ["c", "f"]}, "City": {"type": "string", "pattern": "^[A-Z]"},
                   "days": {"type": "integer", "minimum": 1, "maximum": 7}, "when it is": {"type": "string"}},
    "required": ["City", "unit", "country"]}}},
  {"type": "function", "function": {"name": "get_time"}},
  {"type": "function", "function": {"name": "get", "parameters": {"type": "object",
    "properties": {"ids": {"type": "array", "items": {"type": "integer"}}, "deep": {"type": "object",
      "properties": {"on": {"type": "boolean"}}}}}}}])");

void expect_calls(const JsonGrammar& grammar, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    const std::string text = gemma(c.text);
    const auto [at, complete] = read(grammar, text);
    if (c.valid) EXPECT_TRUE(at == text.size() && complete) << c.text << ": refused at " << at;
    else EXPECT_FALSE(at == text.size() && complete) << c.text << " was taken";
  }
}

// tool_choice "required": one or more calls of the tools, arguments held to their parameters in
// Gemma's syntax (bare keys in the template's dictsort order, strings between <|"|> as they are).
TEST(ToolCallGrammar, CallsHoldTheirArgumentsToTheParameters) {
  const auto required = compile_tool_calls(kTools, nullptr, ToolCallGrammar::Thought::None);
  expect_calls(*required, {
      {R"(<|tool_call>call:get_weather{City:<|"|>Oslo, "NO"\n<|"|>,unit:<|"|>c<|"|>}<tool_call|>)", true},
      {R"(<|tool_call>call:get_weather{City:<|"|>x<|"|>,days:3,unit:<|"|>f<|"|>,<|"|>when it is<|"|>:<|"|>now<|"|>}<tool_call|>)", true},
      {R"(<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get{ids:[1, 2],deep:{on:true}}<tool_call|>)", false},
      {R"(<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get{deep:{on:true},ids:[1,2]}<tool_call|>)", true},
      {R"(<|tool_call>call:get{ deep: { on: false } }<tool_call|>)", false},  // (no whitespace, as the template)
      {R"(<|tool_call>call:get{deep:{on:false}}<tool_call|>)", true},
      // Free text never spells a marker the output parser would act on.
      {R"(<|tool_call>call:get_weather{City:<|"|>a<turn|>b<|"|>,unit:<|"|>c<|"|>}<tool_call|>)", false},
      {R"(<|tool_call>call:get_weather{City:<|"|>a<turn>b<|"|>,unit:<|"|>c<|"|>}<tool_call|>)", true},
      {R"(<|tool_call>call:get_weather{unit:<|"|>c<|"|>,City:<|"|>x<|"|>}<tool_call|>)", false},  // (order)
      {R"(<|tool_call>call:get_weather{City:"x",unit:<|"|>c<|"|>}<tool_call|>)", false},  // (JSON quotes)
      {R"(<|tool_call>call:get_weather{City:<|"|>x<|"|>}<tool_call|>)", false},  // (unit is required)
      {R"(<|tool_call>call:get_weather{City:<|"|>x<|"|>,days:8,unit:<|"|>c<|"|>}<tool_call|>)", false},
      {R"(<|tool_call>call:get_time{a:1}<tool_call|>)", false},
      {R"(<|tool_call>call:get_date{}<tool_call|>)", false},
      {R"(Sure. <|tool_call>call:get_time{}<tool_call|>)", false},
      {R"(<|channel>thought\nhm<channel|><|tool_call>call:get_time{}<tool_call|>)", false},  // (thinking off)
      {R"(<|tool_call>call:get_time{}<tool_call|>)", true},
      {"", false},
  });
  // parallel_tool_calls false: one call.
  const auto one = compile_tool_calls(kTools, nullptr, ToolCallGrammar::Thought::None, 1);
  expect_calls(*one, {{R"(<|tool_call>call:get_time{}<tool_call|>)", true},
                      {R"(<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_time{}<tool_call|>)", false}});
  // A named function: one call of it; with thinking on, a thought may come first; a prompt that
  // opened the thought channel starts in it.
  const std::string get_time = "get_time";
  const auto named = compile_tool_calls(kTools, &get_time, ToolCallGrammar::Thought::Optional);
  expect_calls(*named, {{R"(<|tool_call>call:get_time{}<tool_call|>)", true},
                        {R"(<|channel>thought\nLet me see: {"a"}<channel|><|tool_call>call:get_time{}<tool_call|>)", true},
                        {R"(<|tool_call>call:get_time{}<tool_call|><|tool_call>call:get_time{}<tool_call|>)", false},
                        {R"(<|tool_call>call:get{}<tool_call|>)", false}});
  const auto open = compile_tool_calls(kTools, &get_time, ToolCallGrammar::Thought::Open);
  expect_calls(*open, {{R"(so.<channel|><|tool_call>call:get_time{}<tool_call|>)", true},
                       {R"(so.<|tool_call>call:get_time{}<tool_call|>)", true},
                       {R"(<|tool_call>call:get_time{}<tool_call|>)", true}});
  // An object of undeclared keys: names as the template writes them, up to 64 characters.
  const auto free = compile_tool_calls(nlohmann::json::parse(R"([{"type": "function", "function": {"name": "opts",
      "parameters": {"type": "object", "additionalProperties": {"type": "integer"}}}}])"), nullptr,
      ToolCallGrammar::Thought::Optional);
  expect_calls(*free, {{R"(<|tool_call>call:opts{a:1,b_c.d-é:2}<tool_call|>)", true},
                       {R"(<|tool_call>call:opts{a b:1}<tool_call|>)", false},
                       {"<|tool_call>call:opts{" + std::string(65, 'k') + ":1}<tool_call|>", false},
                       {R"(<|channel>thought
so <eos> then<channel|><|tool_call>call:opts{}<tool_call|>)", false}});
  // "properties": {} declares no arguments.
  const auto none = compile_tool_calls(nlohmann::json::parse(R"([{"type": "function", "function": {"name": "now",
      "parameters": {"type": "object", "properties": {}}}}])"), nullptr, ToolCallGrammar::Thought::None);
  expect_calls(*none, {{R"(<|tool_call>call:now{}<tool_call|>)", true}, {R"(<|tool_call>call:now{a:1}<tool_call|>)", false}});
  // Parameters that allow no arguments object are refused, naming the tool; so are values the
  // parser could not read back.
  for (const char* parameters : {R"({"anyOf": [{"type": "string"}, {"type": "integer"}]})", R"({"enum": [1, 2]})",
                                 R"({"type": "object", "properties": {"x": {"const": "a<tool_call|>"}}})",
                                 R"({"type": "object", "properties": {"a<|\"|>b": {"type": "integer"}}})"}) {
    SCOPED_TRACE(parameters);
    const auto tools = nlohmann::json::array(
        {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", nlohmann::json::parse(parameters)}}}}});
    EXPECT_THROW(compile_tool_calls(tools, nullptr, ToolCallGrammar::Thought::None), ApiError);
  }
  try {
    compile_tool_calls(nlohmann::json::parse(R"([{"type": "function", "function": {"name": "f",
                           "parameters": {"type": "string"}}}])"), nullptr, ToolCallGrammar::Thought::None);
    ADD_FAILURE() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "tools");
    EXPECT_THAT(e.what(), HasSubstr("tools[0].function.parameters"));
  }
}

}  // namespace
}  // namespace tandem::server
