// The Gemma 4 chat renderer against the official template, as rendered by its two peers:
// @huggingface/jinja (tests/js/render_chat_template.mjs) and Python Jinja2
// (tests/tokenizer/render_chat_template.py). Expected renderings are committed, so the comparison
// runs offline; the peers re-render them when they are available.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"
#include "support/test_support.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/jinja_compat.h"

namespace tandem {
namespace {

using nlohmann::json;

std::string template_path() { return test::shared_dir() + "/data/gemma4_chat_template.jinja"; }
std::string data_path(const std::string& name) { return test::source_dir() + "/tests/tokenizer/data/" + name; }
json load_json(const std::string& path) { return json::parse(test::read_file(path)); }

ChatOptions options_of(const json& chat_case) {
  ChatOptions options;
  options.add_generation_prompt = chat_case.value("add_generation_prompt", true);
  options.enable_thinking = chat_case.value("enable_thinking", false);
  options.preserve_thinking = chat_case.value("preserve_thinking", false);
  options.tools = chat_case.value("tools", json());
  return options;
}

std::string case_label(const json& cases, size_t i) {
  return "case " + std::to_string(i) + " (" + cases[i].value("name", std::string("unnamed")) + ")";
}

// Renders every case and compares with the expected strings, byte for byte.
void expect_renderings(const std::string& cases_file, const std::string& expected_file) {
  const json cases = load_json(cases_file);
  const json expected = load_json(expected_file);
  ASSERT_EQ(cases.size(), expected.size()) << cases_file;
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(expected[i].is_string()) << case_label(cases, i) << ": " << expected[i].dump();
    EXPECT_EQ(render_chat(cases[i]["messages"], options_of(cases[i])), expected[i].get<std::string>())
        << case_label(cases, i);
  }
}

// Re-renders the cases with a peer and compares with the committed expectations.
void expect_peer_agrees(const test::CommandResult& peer, const std::string& cases_file,
                        const std::string& expected_file) {
  ASSERT_EQ(peer.exit_code, 0) << peer.out << peer.err;
  const json rendered = json::parse(peer.out);
  const json cases = load_json(cases_file);
  const json expected = load_json(expected_file);
  ASSERT_EQ(rendered.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(rendered[i], expected[i]) << case_label(cases, i);
}

struct CaseFiles {
  std::string cases, expected;
};
CaseFiles official_cases() {
  return {test::shared_dir() + "/data/gemma4_chat_template_cases.json",
          test::shared_dir() + "/data/gemma4_chat_template_expected.json"};
}
CaseFiles project_cases() { return {data_path("chat_cases.json"), data_path("chat_expected.json")}; }
// Where @huggingface/jinja differs from Python, rendered by Python (docs/chat-format.md, "Choices").
CaseFiles python_cases() { return {data_path("chat_python_cases.json"), data_path("chat_python_expected.json")}; }

TEST(ChatFormat, OfficialCasesRenderAsPublished) {
  expect_renderings(official_cases().cases, official_cases().expected);
}

TEST(ChatFormat, ProjectCasesRenderAsTheJinjaPeersDo) {
  expect_renderings(project_cases().cases, project_cases().expected);
}

TEST(ChatFormat, WhereJinjaEnginesDisagreeWeRenderAsPython) {
  expect_renderings(python_cases().cases, python_cases().expected);
}

TEST(ChatFormat, HuggingfaceJinjaStillRendersTheExpectedStrings) {
  if (test::npm_modules().empty())
    GTEST_SKIP() << "npm or its registry is unavailable: @huggingface/jinja not installed";
  const std::string script = test::source_dir() + "/tests/js/render_chat_template.mjs";
  for (const CaseFiles& files : {official_cases(), project_cases()}) {
    SCOPED_TRACE(files.cases);
    expect_peer_agrees(
        test::run_node(script, test::shell_quote(template_path()) + " " + test::shell_quote(files.cases)), files.cases,
        files.expected);
  }
}

TEST(ChatFormat, PythonJinjaStillRendersTheExpectedStrings) {
  if (test::run("python3 -c 'import jinja2' 2>/dev/null").exit_code != 0)
    GTEST_SKIP() << "python3 with jinja2 is unavailable";
  const std::string script = test::source_dir() + "/tests/tokenizer/render_chat_template.py";
  for (const CaseFiles& files : {official_cases(), project_cases(), python_cases()}) {
    SCOPED_TRACE(files.cases);
    expect_peer_agrees(test::run("python3 " + test::shell_quote(script) + " " + test::shell_quote(template_path()) +
                                 " " + test::shell_quote(files.cases)),
                       files.cases, files.expected);
  }
}

// ---- Inputs OpenAI clients send that the template itself does not take ----

json weather_call(const json& arguments) {
  json messages = json::parse(R"([{"role":"user","content":"Weather?"},{"role":"assistant","content":null,
    "tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather"}}]},
    {"role":"tool","tool_call_id":"c1","content":"sunny"}])");
  messages[1]["tool_calls"][0]["function"]["arguments"] = arguments;
  return messages;
}

TEST(ChatFormat, ArgumentsGivenAsJsonTextRenderAsTheObject) {
  const json arguments = {{"city", "Paris"}, {"days", 3}, {"units", {{"temp", "C"}}}, {"alerts", true}};
  const std::string expected = render_chat(weather_call(arguments), {});
  EXPECT_EQ(render_chat(weather_call(arguments.dump()), {}), expected);
  EXPECT_NE(expected.find("call:get_weather{alerts:true,city:<|\"|>Paris<|\"|>,days:3,units:{temp:<|\"|>C<|\"|>}}"),
            std::string::npos)
      << expected;
}

TEST(ChatFormat, NullArgumentsRenderAnEmptyCall) {
  EXPECT_NE(render_chat(weather_call(nullptr), {}).find("<|tool_call>call:get_weather{}<tool_call|>"),
            std::string::npos);
}

TEST(ChatFormat, BosTokenIsConfigurable) {
  ChatOptions options;
  options.bos_token = "";
  options.add_generation_prompt = false;
  EXPECT_EQ(render_chat(json::parse(R"([{"role":"user","content":"Hi"}])"), options), "<|turn>user\nHi<turn|>\n");
}

// ---- Bad input: an Error that names the field ----

void expect_error(const json& messages, const ChatOptions& options, const std::string& message_part) {
  try {
    render_chat(messages, options);
    ADD_FAILURE() << "no Error for " << messages.dump() << "; expected one mentioning '" << message_part << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos)
        << "message: " << e.what() << "\nexpected to contain: " << message_part;
  }
}
void expect_error(const char* messages, const std::string& message_part) {
  expect_error(json::parse(messages), ChatOptions{}, message_part);
}

ChatOptions with_tools(const char* tools) {
  ChatOptions options;
  options.tools = json::parse(tools);
  return options;
}

TEST(ChatFormatErrors, MessagesMustBeANonEmptyArray) {
  expect_error(R"({"role":"user","content":"Hi"})", "messages: must be an array");
  expect_error("[]", "messages: must not be empty");
  expect_error(R"(["Hi"])", "messages[0]: a message must be an object");
}

TEST(ChatFormatErrors, RolesMustBeKnown) {
  expect_error(R"([{"content":"Hi"}])", "messages[0]: a message needs a string 'role'");
  expect_error(R"([{"role":"user","content":"Hi"},{"role":"model","content":"Hello"}])",
               "messages[1]: unknown role 'model'");
  expect_error(R"([{"role":"function","content":"x"}])", "unknown role 'function'");
}

TEST(ChatFormatErrors, ContentMustBeTextPartsOrMedia) {
  expect_error(R"([{"role":"user","content":42}])", "messages[0]: 'content' must be a string, a list of content parts");
  expect_error(R"([{"role":"user","content":{"type":"text","text":"x"}}])", "'content' must be a string");
  expect_error(R"([{"role":"user","content":[{"type":"file","file":{}}]}])",
               "messages[0].content[0]: unsupported content part type 'file'");
  expect_error(R"([{"role":"user","content":["plain string part"]}])", "messages[0].content[0]: a content part must");
  expect_error(R"([{"role":"user","content":[{"text":"no type"}]}])", "a content part needs a string 'type'");
  expect_error(R"([{"role":"user","content":[{"type":"text"}]}])", "a text part needs a string 'text'");
  expect_error(R"([{"role":"system","content":[{"type":"image"}]},{"role":"user","content":"x"}])",
               "messages[0].content[0]: the system turn takes text parts only");
  expect_error(R"([{"role":"system","content":7},{"role":"user","content":"x"}])", "messages[0]: 'content' must be");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","content":"y","reasoning_content":5}])",
               "messages[1]: 'reasoning_content' must be a string");
}

TEST(ChatFormatErrors, ToolCallArgumentsMustBeAnObject) {
  expect_error(weather_call("not json"), {},
               "messages[1].tool_calls[0].function.arguments: 'not json' is not the JSON text of an object");
  expect_error(weather_call("[1, 2]"), {}, "is not the JSON text of an object");
  expect_error(weather_call("null"), {}, "is not the JSON text of an object");
  expect_error(weather_call(17), {}, "arguments: must be a JSON object or JSON text");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"function":{"name":"f"}}]}])",
               "messages[1].tool_calls[0].function: 'arguments' is missing");
}

TEST(ChatFormatErrors, ToolCallsMustBeWellFormed) {
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":{"name":"f"}}])",
               "messages[1]: 'tool_calls' must be an array");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"1"}]}])",
               "messages[1].tool_calls[0]: a tool call needs a 'function' object");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"function":{"arguments":{}}}]}])",
               "messages[1].tool_calls[0].function: 'name' must be a non-empty string");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_responses":[{"name":"f"}]}])",
               "messages[1].tool_responses[0]: 'response' is missing");
}

TEST(ChatFormatErrors, ToolMessagesMustAnswerAToolCall) {
  expect_error(R"([{"role":"user","content":"x"},{"role":"tool","tool_call_id":"1","content":"r"}])",
               "messages[1]: a 'tool' message must follow an assistant message with 'tool_calls'");
  expect_error(R"([{"role":"tool","content":"r"}])", "messages[0]: a 'tool' message must follow");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"1","function":
    {"name":"f","arguments":{}}}]},{"role":"tool","tool_call_id":"1","content":{"a":1}}])",
               "messages[2]: 'content' must be a string, a list of content parts or null");
  expect_error(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"1","function":
    {"name":"f","arguments":{}}}]},{"role":"tool","tool_call_id":"1","name":5,"content":"r"}])",
               "messages[2]: 'name' must be a string");
}

TEST(ChatFormatErrors, ToolsMustBeWellFormed) {
  const json hi = json::parse(R"([{"role":"user","content":"Hi"}])");
  expect_error(hi, with_tools(R"({"type":"function"})"), "tools: must be an array of tools or null");
  expect_error(hi, with_tools(R"(["get_weather"])"), "tools[0]: a tool must be an object");
  expect_error(hi, with_tools(R"([{"type":"function"}])"), "tools[0]: a tool needs a 'function' object");
  expect_error(hi, with_tools(R"([{"type":"function","function":{"description":"d"}}])"),
               "tools[0].function: 'name' must be a non-empty string");
  expect_error(hi, with_tools(R"([{"type":"function","function":{"name":"f","parameters":"city"}}])"),
               "tools[0].function.parameters: must be a JSON schema object");
  expect_error(hi, with_tools(R"([{"type":"function","function":{"name":"f","parameters":{"properties":["a"]}}}])"),
               "tools[0].function.parameters.properties: must be an object");
  expect_error(hi, with_tools(R"([{"type":"function","function":{"name":"f","parameters":{"required":"a"}}}])"),
               "tools[0].function.parameters.required: 'required' must be a list");
  expect_error(hi, with_tools(R"([{"type":"function","function":{"name":"f","parameters":{"properties":
                 {"a":{"type":"object","properties":{"b":{"type":"object","required":"c"}}}}}}}])"),
               "tools[0].function.parameters.properties.a.properties.b.required");
  expect_error(hi, with_tools(R"([{"type":"function","function":{"name":"f","parameters":{"properties":
                 {"a":{"type":"array","items":{"type":7}}}}}}])"),
               "tools[0].function.parameters.properties.a.items.type: must be a type name or a list");
}

// ---- The Python behaviours the renderer reproduces ----

TEST(JinjaCompat, TrimStripsWhatPythonStrStripStrips) {
  EXPECT_EQ(jinja::trim(" \t\n\v\f\r\x1c\x1d\x1e\x1f x \xc2\x85\xc2\xa0\xe3\x80\x80\xe2\x80\xa8"), "x");
  EXPECT_EQ(jinja::trim("\xef\xbb\xbfx\xef\xbb\xbf"), "\xef\xbb\xbfx\xef\xbb\xbf");  // the BOM is not space
  EXPECT_EQ(jinja::trim("\u200bx"), "\u200bx");                                      // nor is U+200B
  EXPECT_EQ(jinja::trim("   "), "");
  EXPECT_EQ(jinja::trim(""), "");
}

TEST(JinjaCompat, FloatsPrintAsPythonRepr) {
  const std::pair<double, const char*> cases[] = {{1.5, "1.5"},
                                                  {2.0, "2.0"},
                                                  {-0.0, "-0.0"},
                                                  {0.0, "0.0"},
                                                  {1e-05, "1e-05"},
                                                  {0.0001, "0.0001"},
                                                  {1e16, "1e+16"},
                                                  {1e15, "1000000000000000.0"},
                                                  {0.1, "0.1"},
                                                  {1.0 / 3, "0.3333333333333333"},
                                                  {123456789.125, "123456789.125"},
                                                  {5e-324, "5e-324"},
                                                  {1.7976931348623157e308, "1.7976931348623157e+308"},
                                                  {-2.5e-7, "-2.5e-07"}};
  for (const auto& [value, repr] : cases) EXPECT_EQ(jinja::python_float_repr(value), repr) << repr;
}

TEST(JinjaCompat, PythonStrOfContainers) {
  EXPECT_EQ(jinja::python_str(json::parse(R"(["string", null, true, 1, 2.5, "it's"])")),
            R"(['string', None, True, 1, 2.5, "it's"])");
  EXPECT_EQ(jinja::python_str(json::parse(R"({"a": [1], "b": "x\ny"})")), R"({'a': [1], 'b': 'x\ny'})");
  EXPECT_EQ(jinja::upper(nullptr), "");
}

}  // namespace
}  // namespace tandem
