// POST /tokenize, POST /detokenize (vLLM's shapes) and GET /v1/models.
#include <httplib.h>

#include <fmt/format.h>

#include "core/error.h"
#include "server/api_error.h"
#include "server/chat_request.h"
#include "server/json_fields.h"
#include "server/openai_format.h"
#include "server/route_context.h"
#include "server/routes.h"

namespace tandem::server {

using nlohmann::json;

namespace {
void send_json(httplib::Response& res, const json& value) { res.set_content(json_text(value), "application/json"); }

json model_card(const RouteContext& context) {
  return {{"id", context.model.name},
          {"object", "model"},
          {"created", context.model.created},
          {"owned_by", "tandem"},
          {"max_model_len", context.model.engine.context_limit()}};
}
}  // namespace

void handle_tokenize(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_object_body(request_body);
  const Tokenizer& tokenizer = context.model.tokenizer;
  std::vector<int32_t> ids;
  if (optional_field(body, "messages")) {
    // The rendered chat starts with <bos> already; add_special_tokens would add a second one.
    const std::string prompt = render_chat_prompt(body);
    ids = tokenizer.encode(prompt, optional_bool(body, "add_special_tokens").value_or(false));
  } else {
    auto text = optional_string(body, "prompt");
    if (!text) text = optional_string(body, "text");
    if (!text) throw invalid_request("prompt", "give the text as 'prompt' (or 'text'), or chat 'messages'");
    ids = tokenizer.encode(*text, optional_bool(body, "add_special_tokens").value_or(true));
  }
  json out = {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", context.model.engine.context_limit()}};
  if (optional_bool(body, "return_token_strs").value_or(false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(std::string(tokenizer.id_to_token(id)));
    out["token_strs"] = std::move(strs);
  }
  send_json(res, out);
}

void handle_detokenize(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_object_body(request_body);
  const json* tokens = optional_field(body, "tokens");
  if (!tokens || !tokens->is_array())
    throw invalid_request("tokens", "'tokens' must be a list of token ids");
  std::vector<int32_t> ids;
  for (const json& v : *tokens) {
    if (!v.is_number_integer() && !v.is_number_unsigned())
      throw invalid_request("tokens", "'tokens' must hold integers only, got " + json_kind(v));
    const int64_t id = v.get<int64_t>();
    if (id < 0 || id >= context.model.tokenizer.vocab_size())
      throw invalid_request("tokens", fmt::format("token id {} is outside the vocabulary (0..{})", id,
                                                  context.model.tokenizer.vocab_size() - 1));
    ids.push_back(int32_t(id));
  }
  const bool skip = optional_bool(body, "skip_special_tokens").value_or(false);
  send_json(res, {{"prompt", context.model.tokenizer.decode(ids, {.skip_special_tokens = skip})}});
}

void handle_models(const RouteContext& context, const std::string& request_body,
                             const httplib::Request& req, httplib::Response& res) {
  if (req.matches.size() > 1) {  // /v1/models/{id}
    const std::string id = req.matches[1];
    if (id != context.model.name)
      throw ApiError(404, "invalid_request_error", fmt::format("the model '{}' does not exist", id), "model",
                     "model_not_found");
    send_json(res, model_card(context));
    return;
  }
  send_json(res, {{"object", "list"}, {"data", json::array({model_card(context)})}});
}

}  // namespace tandem::server
