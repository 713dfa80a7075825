#include "server/generation_response.h"

#include <httplib.h>

namespace tandem::server {

namespace {
// How long the connection thread waits for tokens before it checks that the client is still there.
constexpr std::chrono::milliseconds kPollInterval{50};

struct ResponseState {
  std::unique_ptr<GenerationChoices> choices;
  std::unique_ptr<GenerationFormatter> formatter;
  bool opened = false;
};

bool write(httplib::DataSink& sink, const std::string& bytes) {
  return bytes.empty() || sink.write(bytes.data(), bytes.size());
}
}  // namespace

void respond_with_generation(httplib::Response& res, const std::string& content_type,
                             std::unique_ptr<GenerationChoices> choices, std::unique_ptr<GenerationFormatter> formatter) {
  // Shared because cpp-httplib copies the provider; the state dies with the response, and the
  // streams' destructors cancel the generations nobody finished reading.
  auto state = std::make_shared<ResponseState>();
  state->choices = std::move(choices);
  state->formatter = std::move(formatter);
  if (content_type == "text/event-stream") {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // tell reverse proxies not to buffer the stream
  }
  res.set_chunked_content_provider(content_type, [state](size_t, httplib::DataSink& sink) {
    GenerationChoices& choices = *state->choices;
    if (!state->opened) {
      state->opened = true;
      if (!write(sink, state->formatter->opening())) {
        choices.abandon();
        return false;
      }
    }
    std::string bytes;
    bool ended = false;
    for (const auto& [choice, update] : choices.next(kPollInterval)) {
      bytes += state->formatter->format(choice, update);
      if (update.finished && !update.error.empty()) {
        ended = true;
        choices.abandon("another_choice_failed");
        break;
      }
    }
    if (!ended && choices.finished()) {
      bytes += state->formatter->closing();
      ended = true;
    }
    if (!write(sink, bytes)) {
      choices.abandon();
      return false;
    }
    if (ended) {
      sink.done();
      return true;
    }
    if (bytes.empty() && !sink.is_writable()) {
      choices.abandon();
      return false;
    }
    return true;
  });
}

}  // namespace tandem::server
