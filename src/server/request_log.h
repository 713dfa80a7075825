#pragma once
// One line per request on stderr: method, path, status, time, and what the route adds (tokens,
// finish reason). cpp-httplib serves a request, streams its body and calls the logger all on one
// thread, so the route's notes travel in a thread-local record until the line is written.
#include <chrono>
#include <string>

namespace tandem::server {

// Adds `note` to the log line of the request this thread is serving.
void request_log_note(const std::string& note);

// For the HTTP layer: the request on this thread started now / has been answered (writes the line).
void request_log_begin();
void request_log_end(const std::string& method, const std::string& path, int status, bool enabled);

}  // namespace tandem::server
