#include "tokenizer/tool_declaration.h"

#include <algorithm>
#include <array>

#include "core/error.h"
#include "tokenizer/jinja_compat.h"
#include "tokenizer/tool_syntax.h"

// Mirrors the template's format_parameters / format_function_declaration macros branch by branch,
// including their quirks (an object schema without "properties" lists its other keys as if they
// were properties; a parameters block without "type" is left unclosed). Only what Python's Jinja
// would refuse to render becomes an Error here.
namespace tandem {

namespace {

using jinja::lookup;
using jinja::truthy;
using nlohmann::json;

void append_quoted(std::string& out, std::string_view text) {
  out += kGemmaQuote;
  out += text;
  out += kGemmaQuote;
}

// The template's `{% if add_comma %},{% else %}{% set add_comma = true %}{% endif %}`.
class CommaBeforeField {
 public:
  void operator()(std::string& out) {
    if (needed_) out += ',';
    needed_ = true;
  }
  void mark_needed() { needed_ = true; }

 private:
  bool needed_ = false;
};

// required:[<|"|>a<|"|>,<|"|>b<|"|>]
void append_required(std::string& out, const json& required, const std::string& where) {
  if (!required.is_array()) fail("{}: 'required' must be a list of names", where);
  out += "required:[";
  bool first = true;
  for (const json& name : required) {
    if (!first) out += ',';
    first = false;
    append_quoted(out, jinja::python_str(name));
  }
  out += ']';
}

void append_parameters(std::string& out, const json& properties, bool skip_schema_keys, const std::string& where);

// items:{...} of an array parameter: its keys in order, each in the shape the template gives it.
void append_items(std::string& out, const json& items, const std::string& where) {
  out += "items:{";
  bool first = true;
  for (const auto& [key, value] : jinja::dictsort(items)) {
    if (value->is_null()) continue;
    if (!first) out += ',';
    first = false;
    if (*key == "properties") {
      out += "properties:{";
      if (value->is_object()) append_parameters(out, *value, false, where + ".properties");
      out += '}';
    } else if (*key == "required") {
      append_required(out, *value, where + ".required");
    } else if (*key == "type") {
      out += "type:";
      if (value->is_string()) {
        append_gemma_value(out, jinja::upper(value), true);
      } else if (value->is_array()) {
        json upper_types = json::array();
        for (const json& type : *value) upper_types.push_back(jinja::upper(&type));
        append_gemma_value(out, upper_types, true);
      } else {
        fail("{}.type: must be a type name or a list of them", where);
      }
    } else {
      out += *key;
      out += ':';
      append_gemma_value(out, *value, true);
    }
  }
  out += '}';
}

// One property: NAME:{description:...,enum:...,items:...,nullable:true,properties:...,required:...,type:...}
void append_property(std::string& out, const std::string& name, const json& schema, const std::string& where) {
  out += name;
  out += ":{";
  CommaBeforeField comma;
  if (const json* description = lookup(schema, "description"); truthy(description)) {
    out += "description:";
    append_quoted(out, jinja::python_str(*description));
    comma.mark_needed();
  }
  const std::string type = jinja::upper(lookup(schema, "type"));
  if (type == "STRING") {
    if (const json* choices = lookup(schema, "enum"); truthy(choices)) {
      comma(out);
      out += "enum:";
      append_gemma_value(out, *choices, true);
    }
  } else if (type == "ARRAY") {
    if (const json* items = lookup(schema, "items"); items && items->is_object() && !items->empty()) {
      comma(out);
      append_items(out, *items, where + ".items");
    }
  }
  if (truthy(lookup(schema, "nullable"))) {
    comma(out);
    out += "nullable:true";
  }
  if (type == "OBJECT") {
    comma(out);
    out += "properties:{";
    if (const json* properties = lookup(schema, "properties"); properties && properties->is_object())
      append_parameters(out, *properties, false, where + ".properties");
    else
      append_parameters(out, schema, true, where);
    out += '}';
    if (const json* required = lookup(schema, "required"); truthy(required)) {
      comma(out);
      append_required(out, *required, where + ".required");
    }
  }
  comma(out);
  out += "type:";
  append_quoted(out, type);
  out += '}';
}

// format_parameters: the properties in dictsort order, comma separated. With skip_schema_keys the
// object is a schema itself and its standard keys (description, type, ...) are not properties.
void append_parameters(std::string& out, const json& properties, bool skip_schema_keys, const std::string& where) {
  static constexpr std::array<std::string_view, 5> kSchemaKeys = {"description", "type", "properties", "required",
                                                                  "nullable"};
  bool first = true;
  for (const auto& [key, schema] : jinja::dictsort(properties)) {
    if (skip_schema_keys && std::find(kSchemaKeys.begin(), kSchemaKeys.end(), *key) != kSchemaKeys.end()) continue;
    if (!first) out += ',';
    first = false;
    append_property(out, *key, *schema, where + "." + *key);
  }
}

}  // namespace

std::string format_tool_declaration(const json& tool, std::string_view where_view) {
  const std::string where(where_view);
  if (!tool.is_object())
    fail("{}: a tool must be an object like {{\"type\":\"function\",\"function\":{{...}}}}", where);
  const json* function = lookup(tool, "function");
  if (function == nullptr || !function->is_object()) fail("{}: a tool needs a 'function' object", where);
  const json* name = lookup(function, "name");
  if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty())
    fail("{}.function: 'name' must be a non-empty string", where);

  std::string out = "declaration:" + name->get<std::string>() + "{description:";
  const json* description = lookup(function, "description");
  append_quoted(out, description ? jinja::python_str(*description) : std::string());

  if (const json* parameters = lookup(function, "parameters"); truthy(parameters)) {
    const std::string params_where = where + ".function.parameters";
    if (!parameters->is_object()) fail("{}: must be a JSON schema object", params_where);
    out += ",parameters:{";
    if (const json* properties = lookup(parameters, "properties"); truthy(properties)) {
      if (!properties->is_object()) fail("{}.properties: must be an object of parameter schemas", params_where);
      out += "properties:{";
      append_parameters(out, *properties, false, params_where + ".properties");
      out += "},";
    }
    if (const json* required = lookup(parameters, "required"); truthy(required)) {
      append_required(out, *required, params_where + ".required");
      out += ',';
    }
    if (const json* type = lookup(parameters, "type"); truthy(type)) {
      out += "type:";
      append_quoted(out, jinja::upper(type));
      out += '}';
    }
  }
  if (function->contains("response")) {
    const json& response = (*function)["response"];
    out += ",response:{";
    if (const json* description = lookup(response, "description"); truthy(description)) {
      out += "description:";
      append_quoted(out, jinja::python_str(*description));
      out += ',';
    }
    if (const std::string type = jinja::upper(lookup(response, "type")); type == "OBJECT") {
      out += "type:";
      append_quoted(out, type);
      out += '}';
    }
  }
  out += '}';
  return jinja::trim(out);
}

}  // namespace tandem
