#pragma once
// OpenAI's response_format {"type": "json_schema", "json_schema": {"schema": ...}}: the schema
// compiled to the grammar the output is held to (runtime/json_grammar.h). What the grammar cannot
// hold output to is refused (400, naming the keyword and where it is), never dropped: a reply that
// looks right and is not would be worse.
//
// Held to: type (and type lists), enum, const, properties (written in the schema's order; the ones
// not required may be left out), required, additionalProperties (extra keys only in objects that
// declare no properties), items, minItems, maxItems, minLength, maxLength, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum, anyOf, oneOf (as anyOf), allOf of one schema, $ref within the
// schema (recursion included), nullable. Annotations (title, description, default, format, ...)
// are read past.
#include <nlohmann/json.hpp>

#include <memory>

#include "runtime/json_grammar.h"

namespace tandem::server {

// `param` names the schema in error messages ("response_format.json_schema.schema").
std::shared_ptr<const JsonGrammar> compile_json_schema(const nlohmann::ordered_json& schema, const std::string& param);

// tool_choice "required" (`only` null: one or more calls of any of `tools`, at most `max_calls` when
// not 0) or a named function (`only`: one call of it): the output held to calls in Gemma's syntax,
// each call's arguments to its function's parameters. Lenient where structured output refuses: the assertions above that cannot
// be held (pattern, ...) are left to the function to check, and `required` names that are not
// among the properties are read past, since tool schemas come from tool libraries, not from the
// client. A parameters schema that allows no arguments object is refused (400, param "tools").
std::shared_ptr<const JsonGrammar> compile_tool_calls(const nlohmann::json& tools, const std::string* only,
                                                      ToolCallGrammar::Thought thought, uint32_t max_calls = 0);

}  // namespace tandem::server
