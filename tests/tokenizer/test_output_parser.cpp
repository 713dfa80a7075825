// Parsing Gemma 4 output back into reasoning, content and tool calls, in one go and streaming.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/output_parser.h"
#include "tokenizer/tool_syntax.h"

namespace tandem {

void PrintTo(const ToolCall& call, std::ostream* os) { *os << call.name << call.arguments.dump(); }
void PrintTo(const ParsedOutput& out, std::ostream* os) {
  *os << "{reasoning: \"" << out.reasoning << "\", content: \"" << out.content << "\", tool_calls: [";
  for (const ToolCall& call : out.tool_calls) *os << call.name << call.arguments.dump() << " ";
  *os << "]}";
}

namespace {

using nlohmann::json;

ParsedOutput expected(std::string reasoning, std::string content, std::vector<ToolCall> calls = {}) {
  return ParsedOutput{std::move(reasoning), std::move(content), std::move(calls)};
}

// Texts with every feature of the grammar; each is also streamed at every split.
const std::vector<std::string>& sample_outputs() {
  static const std::vector<std::string> samples = {
      "Plain answer with no markers, a < sign and a | bar.",
      "<|channel>thought\nThe user wants 2+2.<channel|>The answer is 4.",
      "<|channel>thought\nNeed weather.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}"
      "<tool_call|><|tool_response>",
      "<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{nested:{list:[1,-2.5,true,false,null,<|\"|>s<|\"|>],"
      "obj:{k:<|\"|>v<|\"|>}}}<tool_call|>",
      "<|tool_call>call:run{code:<|\"|>f(x) { return {a: 1, b: [2, 3]}; }<|\"|>,note:<|\"|>key:value, other<|\"|>}"
      "<tool_call|>",
      "Text before <|tool_call>call:broken{a:<|\"|>unterminated}<tool_call|> and after",
      "<|channel>thought\nunfinished thinking",
      "Answer then <|tool_call>call:f{a:1",
      "Ends with a partial marker <|chan",
      "Done.<turn|>ignored text after the end",
      "Caf\xc3\xa9 \xe2\x98\x95 \xf0\x9f\x9a\x80 <|channel>thought\n\xe6\x80\x9d\xe8\x80\x83<channel|>\xe7\xad\x94",
      "<|channel>no header here<channel|>answer",
      "stray <channel|> and <tool_call|> markers are dropped",
  };
  return samples;
}

ParsedOutput stream(const std::vector<std::string>& pieces, OutputParserOptions options = {}) {
  OutputParser parser(options);
  ParsedOutput total;
  for (const std::string& piece : pieces) total.append(parser.push(piece));
  total.append(parser.finish());
  return total;
}

TEST(OutputParser, PlainTextIsContent) {
  EXPECT_EQ(parse_output("Hello, world!"), expected("", "Hello, world!"));
  EXPECT_EQ(parse_output(""), expected("", ""));
}

TEST(OutputParser, ThoughtChannelIsReasoning) {
  EXPECT_EQ(parse_output("<|channel>thought\nLet me think.\n<channel|>The answer is 4."),
            expected("Let me think.\n", "The answer is 4."));
  // Without the "thought" header line the channel text is still reasoning.
  EXPECT_EQ(parse_output("<|channel>hmm<channel|>ok"), expected("hmm", "ok"));
}

TEST(OutputParser, ToolCallsBecomeNamesAndJsonArguments) {
  const ParsedOutput out = parse_output(sample_outputs()[3]);
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0], (ToolCall{"a", json{{"x", 1}}}));
  EXPECT_EQ(out.tool_calls[1].name, "b");
  EXPECT_EQ(out.tool_calls[1].arguments,
            json::parse(R"({"nested":{"list":[1,-2.5,true,false,null,"s"],"obj":{"k":"v"}}})"));
  EXPECT_EQ(out.content, "");
}

TEST(OutputParser, StringsMayHoldBracesCommasAndColons) {
  const ParsedOutput out = parse_output(sample_outputs()[4]);
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments,
            json({{"code", "f(x) { return {a: 1, b: [2, 3]}; }"}, {"note", "key:value, other"}}));
}

TEST(OutputParser, ReasoningThenToolCallThenEnd) {
  EXPECT_EQ(parse_output(sample_outputs()[2]),
            expected("Need weather.", "", {ToolCall{"get_weather", json{{"city", "Paris"}, {"days", 3}}}}));
}

TEST(OutputParser, MalformedToolCallIsReturnedAsContent) {
  EXPECT_EQ(parse_output(sample_outputs()[5]),
            expected("", "Text before <|tool_call>call:broken{a:<|\"|>unterminated}<tool_call|> and after"));
  EXPECT_EQ(parse_output("<|tool_call>get_weather{}<tool_call|>").content, "<|tool_call>get_weather{}<tool_call|>");
  EXPECT_EQ(parse_output("<|tool_call>call:f{a:1}}<tool_call|>").content, "<|tool_call>call:f{a:1}}<tool_call|>");
}

TEST(OutputParser, WithoutToolsACallIsContent) {
  const OutputParserOptions no_tools{.parse_tool_calls = false};
  EXPECT_EQ(parse_output("Sure <|tool_call>call:f{a:1}<tool_call|> done", no_tools),
            expected("", "Sure <|tool_call>call:f{a:1}<tool_call|> done"));
  EXPECT_EQ(parse_output(sample_outputs()[2], no_tools).tool_calls.size(), 0u);
  // The other markers still act.
  EXPECT_EQ(parse_output("<|channel>thought\nhm<channel|><|tool_call>x<turn|>after", no_tools),
            expected("hm", "<|tool_call>x"));
  EXPECT_TRUE(is_output_marker("<|tool_call>", true));
  EXPECT_FALSE(is_output_marker("<|tool_call>", false));
  EXPECT_TRUE(is_output_marker("<turn|>", false));
  EXPECT_FALSE(is_output_marker("<bos>", true));
}

TEST(OutputParser, UnterminatedMarkersAtTheEnd) {
  EXPECT_EQ(parse_output(sample_outputs()[6]), expected("unfinished thinking", ""));
  EXPECT_EQ(parse_output(sample_outputs()[7]), expected("", "Answer then <|tool_call>call:f{a:1"));
  EXPECT_EQ(parse_output(sample_outputs()[8]), expected("", "Ends with a partial marker <|chan"));
  EXPECT_EQ(parse_output("<|channel>thou"), expected("thou", ""));
}

TEST(OutputParser, EndOfTurnMarkersEndTheAnswer) {
  EXPECT_EQ(parse_output(sample_outputs()[9]), expected("", "Done."));
  EXPECT_EQ(parse_output("a<|turn>user\nb"), expected("", "a"));
  EXPECT_EQ(parse_output("a<eos>b"), expected("", "a"));
}

TEST(OutputParser, PromptThatOpenedTheThoughtChannel) {
  ChatOptions options;
  options.enable_thinking = true;
  const std::string prompt = render_chat(json::parse(R"([{"role":"user","content":"Weather?"},
    {"role":"assistant","tool_calls":[{"id":"1","function":{"name":"w","arguments":{}}}]},
    {"role":"tool","tool_call_id":"1","content":"rain"}])"),
                                         options);
  ASSERT_TRUE(prompt_opens_reasoning(prompt)) << prompt;
  EXPECT_FALSE(prompt_opens_reasoning(render_chat(json::parse(R"([{"role":"user","content":"x"}])"), options)));
  EXPECT_EQ(parse_output("It rains.<channel|>Take an umbrella.", {.starts_in_reasoning = true}),
            expected("It rains.", "Take an umbrella."));
}

TEST(OutputParser, HoldsBackWhatMayBecomeAMarker) {
  OutputParser parser;
  EXPECT_EQ(parser.push("Hello <|chan"), expected("", "Hello "));
  EXPECT_EQ(parser.push("nel>thou"), expected("", ""));
  EXPECT_EQ(parser.push("ght\nhmm <"), expected("hmm ", ""));
  EXPECT_EQ(parser.push("channel|>Hi <|tool_call>call:f{a:"), expected("", "Hi "));
  EXPECT_EQ(parser.push("1}<tool_call|>"), expected("", "", {ToolCall{"f", json{{"a", 1}}}}));
  EXPECT_EQ(parser.finish(), expected("", ""));
}

TEST(OutputParser, DeltasAreWholeUtf8Characters) {
  OutputParser parser;
  EXPECT_EQ(parser.push("caf\xc3"), expected("", "caf"));
  EXPECT_EQ(parser.push("\xa9 \xf0\x9f"), expected("", "\xc3\xa9 "));
  EXPECT_EQ(parser.push("\x9a\x80"), expected("", "\xf0\x9f\x9a\x80"));
  EXPECT_EQ(parser.finish(), expected("", ""));
}

TEST(OutputParser, StreamingAtEverySplitEqualsOneShot) {
  for (const std::string& text : sample_outputs()) {
    const ParsedOutput whole = parse_output(text);
    for (size_t split = 0; split <= text.size(); ++split)
      EXPECT_EQ(stream({text.substr(0, split), text.substr(split)}), whole) << text << " split at " << split;
    for (size_t a = 0; a <= text.size(); a += 3)
      for (size_t b = a; b <= text.size(); b += 5)
        EXPECT_EQ(stream({text.substr(0, a), text.substr(a, b - a), text.substr(b)}), whole) << text;
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    EXPECT_EQ(stream(bytes), whole) << text << " byte by byte";
  }
}

TEST(OutputParser, ContentNeverCarriesMarkerText) {
  for (const std::string& text : {sample_outputs()[1], sample_outputs()[2], sample_outputs()[3], sample_outputs()[9]}) {
    OutputParser parser;
    for (char c : text) {
      const ParsedOutput delta = parser.push(std::string(1, c));
      EXPECT_EQ(delta.content.find('<'), std::string::npos) << text;
      EXPECT_EQ(delta.reasoning.find('<'), std::string::npos) << text;
    }
  }
}

// ---- Gemma's value syntax, both directions ----

TEST(ToolSyntax, RenderedArgumentsParseBack) {
  const json values[] = {
      json::parse(R"({"s":"text, with: {braces} [and] commas","i":-42,"f":0.125,"e":1e-05,"t":true,"n":null})"),
      json::parse(R"({"deep":{"list":[[1,2],[{"a":[]}],{}],"unicode":"\u00e9\u4f60\ud83d\ude80"}})"),
      json::parse(R"({"big":18446744073709551615,"neg":-9223372036854775808,"empty":""})"),
  };
  for (const json& value : values) {
    EXPECT_EQ(parse_gemma_value(format_gemma_value(value, false)), value) << format_gemma_value(value, false);
    EXPECT_EQ(parse_gemma_value(format_gemma_value(value, true)), value) << format_gemma_value(value, true);
  }
}

TEST(ToolSyntax, ToolCallsInPromptsParseBack) {
  const json arguments = json::parse(R"({"query":"a:b, {c}","limit":10,"filters":{"from":2020,"tags":["x","y"]}})");
  json messages = json::parse(R"([{"role":"user","content":"x"},{"role":"assistant","tool_calls":
    [{"id":"1","function":{"name":"search"}}]}])");
  messages[1]["tool_calls"][0]["function"]["arguments"] = arguments;
  const std::string prompt = render_chat(messages, {});
  const size_t begin = prompt.find("<|tool_call>");
  ASSERT_NE(begin, std::string::npos) << prompt;
  EXPECT_EQ(parse_output(prompt.substr(begin)).tool_calls, (std::vector<ToolCall>{{"search", arguments}}));
}

TEST(ToolSyntax, AcceptsWhitespaceQuotedKeysAndBareWords) {
  EXPECT_EQ(parse_gemma_value(" { <|\"|>a b<|\"|> : [ 1 , 2 ] , mode : fast , x: 1.5e3 } "),
            json::parse(R"({"a b":[1,2],"mode":"fast","x":1500.0})"));
  EXPECT_EQ(parse_gemma_tool_call("call:get_time{}"), (ToolCall{"get_time", json::object()}));
}

TEST(ToolSyntax, MalformedTextIsAnError) {
  for (const char* text : {"{a:<|\"|>open}", "{a 1}", "{a:1", "{a:1} trailing", "[1,,2]", "{:1}", "", "{a:1,}"})
    EXPECT_THROW(parse_gemma_value(text), Error) << text;
  EXPECT_THROW(parse_gemma_value(std::string(1000, '[') + std::string(1000, ']')), Error);
  for (const char* body : {"get{}", "call:{}", "call:f", "call:f g{}", "call:f[1]"})
    EXPECT_THROW(parse_gemma_tool_call(body), Error) << body;
}

}  // namespace
}  // namespace tandem
