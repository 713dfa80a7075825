#pragma once
// Serves the GenerationChoices of one request as an HTTP response body. The body is written by cpp-httplib's chunked
// content provider on the connection's thread, so the thread waits for tokens with the socket in
// hand: when a write fails, or the peer has closed while we wait (checked every poll interval), the
// engine request is cancelled at once and its KV blocks are freed at the engine's next step. This
// holds for non-streaming requests too, whose single JSON body is written when generation ends.
#include <memory>
#include <string>

#include "server/generation_stream.h"

namespace httplib {
struct Response;
}

namespace tandem::server {

// Formats updates into response bytes: SSE events for streams, one JSON document otherwise.
class GenerationFormatter {
 public:
  virtual ~GenerationFormatter() = default;
  virtual std::string opening() { return {}; }  // written before the first update
  // Bytes for one choice's update (often none). An update that finished with an error ends the
  // response: its bytes are everything up to the end of the body, and the other choices are cancelled.
  virtual std::string format(int choice, const GenerationUpdate& update) = 0;
  // Once every choice has finished without error: the rest of the body.
  virtual std::string closing() = 0;
};

void respond_with_generation(httplib::Response& res, const std::string& content_type,
                             std::unique_ptr<GenerationChoices> choices, std::unique_ptr<GenerationFormatter> formatter);

}  // namespace tandem::server
