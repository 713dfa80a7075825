#include "tokenizer/output_parser.h"

#include <algorithm>
#include <array>
#include <optional>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace tandem {

namespace {

constexpr std::string_view kChannelOpen = "<|channel>";
constexpr std::string_view kChannelClose = "<channel|>";
constexpr std::string_view kToolCallOpen = "<|tool_call>";
constexpr std::string_view kToolCallClose = "<tool_call|>";
constexpr std::string_view kThoughtHeader = "thought\n";

// The markers recognized in content and reasoning. The last four end the answer: the server stops
// on them, and if their text reaches us anyway what follows is not part of this answer.
constexpr std::array<std::string_view, 8> kMarkers = {kChannelOpen, kChannelClose,      kToolCallOpen, kToolCallClose,
                                                      "<turn|>",    "<|tool_response>", "<|turn>",     "<eos>"};

bool is_end_marker(std::string_view marker) {
  return std::find(kMarkers.begin() + 4, kMarkers.end(), marker) != kMarkers.end();
}

struct MarkerHit {
  size_t pos;
  std::string_view marker;
};

std::optional<MarkerHit> find_first_marker(std::string_view text) {
  for (size_t pos = text.find('<'); pos != std::string_view::npos; pos = text.find('<', pos + 1)) {
    const std::string_view rest = text.substr(pos);
    for (std::string_view marker : kMarkers)
      if (rest.starts_with(marker)) return MarkerHit{pos, marker};
  }
  return std::nullopt;
}

// Bytes at the end of `text` that might still become a marker.
size_t partial_marker_length(std::string_view text) {
  size_t longest = 0;
  for (std::string_view marker : kMarkers) longest = std::max(longest, marker.size());
  const size_t first = text.size() > longest - 1 ? text.size() - (longest - 1) : 0;
  for (size_t start = text.find('<', first); start != std::string_view::npos; start = text.find('<', start + 1)) {
    const std::string_view tail = text.substr(start);
    for (std::string_view marker : kMarkers)
      if (marker.size() > tail.size() && marker.starts_with(tail)) return tail.size();
  }
  return 0;
}

// Bytes of an unfinished UTF-8 sequence at the end of `text`, so deltas are always whole characters.
size_t partial_utf8_length(std::string_view text) {
  for (size_t back = 1; back <= std::min<size_t>(3, text.size()); ++back) {
    const auto byte = static_cast<unsigned char>(text[text.size() - back]);
    if ((byte & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    if (byte < 0xC0) return 0;
    return size_t(utf8::sequence_length(byte)) > back ? back : 0;
  }
  return 0;
}

}  // namespace

void ParsedOutput::append(ParsedOutput&& more) {
  reasoning += more.reasoning;
  content += more.content;
  for (ToolCall& call : more.tool_calls) tool_calls.push_back(std::move(call));
}

bool prompt_opens_reasoning(std::string_view prompt) {
  return prompt.ends_with(std::string(kChannelOpen) + std::string(kThoughtHeader));
}

bool is_output_marker(std::string_view text, bool tool_calls) {
  if (!tool_calls && (text == kToolCallOpen || text == kToolCallClose)) return false;
  return std::find(kMarkers.begin(), kMarkers.end(), text) != kMarkers.end();
}

OutputParser::OutputParser(OutputParserOptions options)
    : state_(options.starts_in_reasoning ? State::kReasoning : State::kContent),
      parse_tool_calls_(options.parse_tool_calls) {}

OutputParser::Delta OutputParser::push(std::string_view text) {
  Delta delta;
  pending_.append(text);
  drain(false, delta);
  return delta;
}

OutputParser::Delta OutputParser::finish() {
  Delta delta;
  drain(true, delta);
  state_ = State::kEnded;
  pending_.clear();
  return delta;
}

void OutputParser::emit_text(std::string_view text, Delta& delta) const {
  (state_ == State::kReasoning ? delta.reasoning : delta.content) += text;
}

void OutputParser::drain(bool at_end, Delta& delta) {
  for (;;) {
    switch (state_) {
      case State::kEnded: pending_.clear(); return;

      case State::kChannelHeader:  // right after <|channel>: the channel's name line
        if (pending_.starts_with(kThoughtHeader)) {
          pending_.erase(0, kThoughtHeader.size());
        } else if (!at_end && kThoughtHeader.starts_with(pending_)) {
          return;  // wait for more
        }
        state_ = State::kReasoning;
        break;

      case State::kToolCall: {
        const size_t close = pending_.find(kToolCallClose, tool_call_scanned_);
        if (close == std::string::npos) {
          if (at_end) {  // unfinished: return it as the model wrote it
            delta.content += kToolCallOpen;
            delta.content += pending_;
            pending_.clear();
            state_ = State::kContent;
          }
          // Next time, search only where the marker could still start (long calls arrive in many pieces).
          tool_call_scanned_ =
              pending_.size() >= kToolCallClose.size() ? pending_.size() - kToolCallClose.size() + 1 : 0;
          return;
        }
        tool_call_scanned_ = 0;
        const std::string_view body = std::string_view(pending_).substr(0, close);
        try {
          delta.tool_calls.push_back(parse_gemma_tool_call(body));
        } catch (const Error&) {
          delta.content += kToolCallOpen;
          delta.content += body;
          delta.content += kToolCallClose;
        }
        pending_.erase(0, close + kToolCallClose.size());
        state_ = State::kContent;
        break;
      }

      case State::kContent:
      case State::kReasoning: {
        const std::optional<MarkerHit> hit = find_first_marker(pending_);
        if (!hit) {
          const size_t held = at_end ? 0 : std::max(partial_marker_length(pending_), partial_utf8_length(pending_));
          emit_text(std::string_view(pending_).substr(0, pending_.size() - held), delta);
          pending_.erase(0, pending_.size() - held);
          return;
        }
        emit_text(std::string_view(pending_).substr(0, hit->pos), delta);
        if (!parse_tool_calls_ && (hit->marker == kToolCallOpen || hit->marker == kToolCallClose))
          emit_text(hit->marker, delta);
        pending_.erase(0, hit->pos + hit->marker.size());
        if (is_end_marker(hit->marker)) {
          state_ = State::kEnded;
        } else if (hit->marker == kToolCallOpen && parse_tool_calls_) {
          state_ = State::kToolCall;  // a call also closes an unclosed thought
        } else if (hit->marker == kChannelOpen) {
          if (state_ == State::kContent) state_ = State::kChannelHeader;
        } else if (hit->marker == kChannelClose) {
          state_ = State::kContent;
        }
        // a stray <tool_call|> (or a second <|channel>) is dropped
        break;
      }
    }
  }
}

ParsedOutput parse_output(std::string_view text, OutputParserOptions options) {
  OutputParser parser(options);
  ParsedOutput result = parser.push(text);
  result.append(parser.finish());
  return result;
}

}  // namespace tandem
