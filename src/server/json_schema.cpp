#include "server/json_schema.h"

#include <fmt/format.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "server/api_error.h"
#include "tokenizer/jinja_compat.h"
#include "tokenizer/tool_syntax.h"

namespace tandem::server {

namespace {

using ojson = nlohmann::ordered_json;
using Node = JsonSchemaNode;

// Keywords that only describe, or hold subschemas reached through $ref: read past.
const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default", "examples", "example", "$schema", "$id", "$anchor", "$comment", "deprecated",
    "readOnly", "writeOnly", "$defs", "definitions", "format", "contentEncoding", "contentMediaType", "discriminator",
    "strict", "additionalItems"};
// Assertions the grammar cannot hold output to.
const std::set<std::string, std::less<>> kUnsupported = {
    "pattern", "multipleOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "dependencies",
    "patternProperties", "propertyNames", "minProperties", "maxProperties", "unevaluatedProperties",
    "unevaluatedItems", "contains", "minContains", "maxContains", "prefixItems", "$dynamicRef", "$recursiveRef",
    "uniqueItems"};

constexpr int kMaxSchemaNesting = 256;
constexpr size_t kMaxChoices = 128;  // schemas an anyOf resolves to
constexpr __int128 kScale = 1'000'000'000'000'000;                 // 10^Node::kBoundDecimals
constexpr __int128 kLargest = __int128(10'000'000'000'000'000'000u) * kScale - 1;  // 19 integer digits

// The types of a node that some value can have, given which nodes have values at all.
uint8_t possible_types(const Node& node, const std::vector<bool>& has_values) {
  uint8_t types = node.types;
  if (node.min_length > node.max_length) types &= uint8_t(~Node::kString);
  if (node.min_items > node.max_items || (node.min_items > 0 && !has_values[size_t(node.items)]))
    types &= uint8_t(~Node::kArray);
  for (const Node::Property& p : node.properties)
    if (p.required && !has_values[size_t(p.node)]) types &= uint8_t(~Node::kObject);
  if (node.bounded && node.minimum > node.maximum) types &= uint8_t(~(Node::kInteger | Node::kNumber));
  return types;
}

// Every choice the output can take must lead to a value, or the mask would strand it: the nodes that
// have values (from the leaves up), then the choices that lead nowhere cut out. Returns which nodes
// have values.
std::vector<bool> prune(JsonGrammar& grammar) {
  std::vector<Node>& nodes = grammar.nodes;
  std::vector<bool> has_values(nodes.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) {
      if (has_values[i]) continue;
      const Node& node = nodes[i];
      const bool any = !node.any_of.empty()
                           ? std::any_of(node.any_of.begin(), node.any_of.end(),
                                         [&](int32_t a) { return bool(has_values[size_t(a)]); })
                           : !node.literals.empty() || possible_types(node, has_values) != 0;
      if (any) has_values[i] = changed = true;
    }
  }
  for (Node& node : nodes) {
    std::erase_if(node.any_of, [&](int32_t a) { return !has_values[size_t(a)]; });
    if (!node.any_of.empty() || !node.literals.empty()) continue;
    node.types = possible_types(node, has_values);
    std::erase_if(node.properties, [&](const Node::Property& p) { return !p.required && !has_values[size_t(p.node)]; });
    if (node.other_properties >= 0 && !has_values[size_t(node.other_properties)]) node.other_properties = -1;
    if (!has_values[size_t(node.items)]) node.max_items = 0;
  }
  return has_values;
}


// anyOf and $ref chains resolved to the nodes they end at, so that reading follows one level of
// choice however the schema nests them (a left recursion or a long chain of refs costs nothing when
// reading). False when there are too many to resolve.
bool flatten_choices(JsonGrammar& grammar) {
  std::vector<Node>& nodes = grammar.nodes;
  std::vector<size_t> seen(nodes.size(), 0);
  size_t budget = 4'000'000;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].any_of.empty()) continue;
    std::vector<int32_t> leaves, pending = {int32_t(i)};
    seen[i] = i + 1;
    while (!pending.empty()) {
      const int32_t at = pending.back();
      pending.pop_back();
      if (budget-- == 0) return false;
      if (nodes[size_t(at)].any_of.empty()) {
        leaves.push_back(at);
        continue;
      }
      const std::vector<int32_t>& next = nodes[size_t(at)].any_of;
      for (auto it = next.rbegin(); it != next.rend(); ++it)  // (the schema's order first)
        if (seen[size_t(*it)] != i + 1) seen[size_t(*it)] = i + 1, pending.push_back(*it);
    }
    if (leaves.size() > kMaxChoices) return false;  // (each value's first bytes would try them all)
    nodes[i].any_of = std::move(leaves);
  }
  return true;
}

// The fewest nested containers each node's values need (JsonSchemaNode::min_depth), relaxed from
// "none" down to the least; false when the schema is too large to settle.
constexpr uint32_t kNoDepth = 1u << 30;
bool compute_depths(JsonGrammar& grammar) {
  std::vector<Node>& nodes = grammar.nodes;
  for (Node& node : nodes) node.min_depth = node.min_object_depth = node.min_array_depth = kNoDepth;
  for (int round = 0; round < 4096; ++round) {
    bool changed = false;
    for (Node& node : nodes) {
      uint32_t depth = kNoDepth;
      if (!node.any_of.empty()) {
        for (int32_t a : node.any_of) depth = std::min(depth, nodes[size_t(a)].min_depth);
      } else if (!node.literals.empty()) {
        depth = 0;  // (a literal is read byte by byte, without nesting)
      } else {
        if (node.types & Node::kArray)
          node.min_array_depth = std::min(kNoDepth, 1 + (node.min_items > 0 ? nodes[size_t(node.items)].min_depth : 0));
        if (node.types & Node::kObject) {
          uint32_t deepest = 0;
          for (const Node::Property& p : node.properties)
            if (p.required) deepest = std::max(deepest, nodes[size_t(p.node)].min_depth);
          node.min_object_depth = std::min(kNoDepth, 1 + deepest);
        }
        if (node.types & ~(Node::kArray | Node::kObject)) depth = 0;
        if (node.types & Node::kArray) depth = std::min(depth, node.min_array_depth);
        if (node.types & Node::kObject) depth = std::min(depth, node.min_object_depth);
      }
      if (depth < node.min_depth) node.min_depth = depth, changed = true;
    }
    if (!changed) return true;
  }
  return false;
}

// Nodes of one schema added to `grammar`. In Gemma's tool syntax (`tool_arguments`) keys are bare,
// in the order the chat template writes them (dictsort), literals are written as Gemma writes them,
// and the assertions structured output refuses are not held (see the header).
class SchemaCompiler {
 public:
  SchemaCompiler(JsonGrammar& grammar, const ojson& root, std::string param, bool tool_arguments)
      : grammar_(grammar), root_(root), param_(std::move(param)), tool_arguments_(tool_arguments) {}

  int32_t run() { return compile(root_, ""); }

  [[noreturn]] void refuse(const std::string& pointer, const std::string& message) const {
    const std::string where = param_ + (pointer.empty() ? "" : "#" + pointer);
    if (tool_arguments_) throw invalid_request("tools", fmt::format("{}: {}", where, message));
    throw invalid_request("response_format", fmt::format("{}: {}", where, message));
  }

 private:
  int32_t add(Node node) {
    grammar_.nodes.push_back(std::move(node));
    return int32_t(grammar_.nodes.size() - 1);
  }

  int32_t any() {
    if (any_ < 0) {
      any_ = add(Node{});
      grammar_.nodes[size_t(any_)].other_properties = any_;
      grammar_.nodes[size_t(any_)].items = any_;
    }
    return any_;
  }

  // Only annotations may stand beside `keyword` (a $ref, an allOf, an anyOf).
  void only_annotations_beside(const ojson& s, const std::string& pointer, const char* keyword) const {
    for (const auto& [key, value] : s.items())
      if (key != keyword && !kAnnotations.count(key) && !(tool_arguments_ && kUnsupported.count(key)))
        refuse(pointer, fmt::format("'{}' beside '{}' is not supported", key, keyword));
  }

  uint32_t count(const ojson& s, const std::string& pointer, const char* keyword, uint32_t fallback) const {
    const auto it = s.find(keyword);
    if (it == s.end()) return fallback;
    if (it->is_number_unsigned())
      return uint32_t(std::min<uint64_t>(it->get<uint64_t>(), std::numeric_limits<uint32_t>::max()));
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      refuse(pointer, fmt::format("'{}' must be a non-negative integer", keyword));
    return uint32_t(std::min<int64_t>(it->get<int64_t>(), std::numeric_limits<uint32_t>::max()));
  }

  int32_t compile(const ojson& s, const std::string& pointer) {
    if (const auto done = by_pointer_.find(pointer); done != by_pointer_.end()) return done->second;
    // Each level is a call here, so a long $ref chain must not run the stack out.
    if (nesting_ >= kMaxSchemaNesting)
      refuse(pointer, fmt::format("the schema nests (through $ref, anyOf, properties, items) deeper than {} levels",
                                  kMaxSchemaNesting));
    struct Nested {
      int& n;
      explicit Nested(int& level) : n(++level) {}
      ~Nested() { --n; }
    } nested(nesting_);
    if (s.is_boolean()) {
      Node node;
      if (s.get<bool>()) return any();
      node.types = 0;
      return add(node);
    }
    if (!s.is_object()) refuse(pointer, fmt::format("a schema must be an object or a boolean"));
    for (const auto& [key, value] : s.items())
      if (kUnsupported.count(key) && !(key == "uniqueItems" && value == false) && !tool_arguments_)
        refuse(pointer, fmt::format("'{}' is not supported", key));
    const int32_t index = add(Node{});
    by_pointer_[pointer] = index;
    Node node = build(s, pointer);
    grammar_.nodes[size_t(index)] = std::move(node);
    return index;
  }

  Node build(const ojson& s, const std::string& pointer) {
    Node node;
    if (const auto ref = s.find("$ref"); ref != s.end()) {
      only_annotations_beside(s, pointer, "$ref");
      if (!ref->is_string() || ref->get<std::string>().rfind('#', 0) != 0)
        refuse(pointer, "'$ref' must point into the schema itself ('#...')");
      const std::string target = ref->get<std::string>().substr(1);
      const ojson* found = nullptr;
      try {
        const ojson::json_pointer at(target);
        if (root_.contains(at)) found = &root_.at(at);
      } catch (const nlohmann::json::exception&) {
      }
      if (found == nullptr) refuse(pointer, fmt::format("'$ref' '{}' points nowhere in the schema", ref->get<std::string>()));
      node.any_of = {compile(*found, target)};  // (a one-way choice: the target may still be being compiled)
      return node;
    }
    for (const char* keyword : {"anyOf", "oneOf", "allOf"}) {
      const auto it = s.find(keyword);
      if (it == s.end()) continue;
      only_annotations_beside(s, pointer, keyword);
      if (!it->is_array() || it->empty()) refuse(pointer, fmt::format("'{}' must be a non-empty array", keyword));
      if (std::string_view(keyword) == "allOf" && it->size() > 1)
        refuse(pointer, "'allOf' of more than one schema is not supported");
      for (size_t i = 0; i < it->size(); ++i)
        node.any_of.push_back(compile((*it)[i], fmt::format("{}/{}/{}", pointer, keyword, i)));
      return node;
    }

    if (const auto type = s.find("type"); type != s.end()) {
      node.types = 0;
      const auto add_type = [&](const ojson& name) {
        static const std::map<std::string, uint8_t, std::less<>> kTypes = {
            {"null", Node::kNull},     {"boolean", Node::kBoolean}, {"integer", Node::kInteger},
            {"number", Node::kNumber}, {"string", Node::kString},   {"array", Node::kArray},
            {"object", Node::kObject}};
        const auto it = name.is_string() ? kTypes.find(name.get<std::string>()) : kTypes.end();
        if (it == kTypes.end()) refuse(pointer, fmt::format("'type' {} is not a JSON Schema type", name.dump()));
        node.types |= it->second;
      };
      if (type->is_array()) for (const ojson& name : *type) add_type(name);
      else add_type(*type);
    }
    if (const auto nullable = s.find("nullable"); nullable != s.end()) {
      if (!nullable->is_boolean()) refuse(pointer, "'nullable' must be a boolean");
      if (nullable->get<bool>()) node.types |= Node::kNull;
    }

    const auto enumerated = s.find("enum");
    const auto constant = s.find("const");
    if (enumerated != s.end() || constant != s.end()) {
      if (enumerated != s.end() && !enumerated->is_array()) refuse(pointer, "'enum' must be an array");
      if (enumerated != s.end() && constant != s.end()) refuse(pointer, "'enum' and 'const' together are not supported");
      // The values are written as they are: constraints beside them would go unchecked.
      for (const auto& [key, value] : s.items())
        if (key != "enum" && key != "const" && key != "type" && key != "nullable" && !kAnnotations.count(key))
          refuse(pointer, fmt::format("'{}' beside '{}' is not supported", key, constant != s.end() ? "const" : "enum"));
      const ojson values = constant != s.end() ? ojson::array({*constant}) : *enumerated;
      for (const ojson& value : values)
        if (has_type(node.types, value)) node.literals.push_back(literal(value, pointer));
      std::sort(node.literals.begin(), node.literals.end());
      node.literals.erase(std::unique(node.literals.begin(), node.literals.end()), node.literals.end());
      if (node.literals.empty()) node.types = 0;  // no value allowed
      return node;
    }

    if (const auto properties = s.find("properties"); properties != s.end()) {
      if (!properties->is_object()) refuse(pointer, "'properties' must be an object");
      for (const std::string& name : property_order(*properties)) {
        if (tool_arguments_ && spells_gemma_marker(name))
          refuse(pointer, fmt::format("the property name {} spells one of Gemma's markers", ojson(name).dump()));
        node.properties.push_back(
            {key_text(name), compile((*properties)[name], pointer + "/properties/" + pointer_token(name)), false});
      }
    }
    if (const auto required = s.find("required"); required != s.end()) {
      if (!required->is_array()) refuse(pointer, "'required' must be an array of property names");
      for (const ojson& name : *required) {
        const std::string key = name.is_string() ? key_text(name.get<std::string>()) : "";
        auto it = std::find_if(node.properties.begin(), node.properties.end(),
                               [&](const Node::Property& p) { return p.key == key; });
        if (name.is_string() && it != node.properties.end()) it->required = true;
        else if (!tool_arguments_) refuse(pointer, fmt::format("required property {} is not among 'properties'", name.dump()));
      }
    }
    const auto additional = s.find("additionalProperties");
    // A tool's "properties": {} declares that it takes no arguments: no other keys unless asked for.
    const bool declared_none = tool_arguments_ && s.contains("properties") && additional == s.end();
    if (node.properties.empty() && !declared_none && (additional == s.end() || *additional != false)) {
      node.other_properties = additional == s.end() || additional->is_boolean()
                                  ? any()
                                  : compile(*additional, pointer + "/additionalProperties");
    }

    if (const auto items = s.find("items"); items != s.end()) {
      if (items->is_array()) refuse(pointer, "'items' as an array (a tuple) is not supported");
      node.items = compile(*items, pointer + "/items");
    } else {
      node.items = any();
    }
    node.min_items = count(s, pointer, "minItems", 0);
    node.max_items = count(s, pointer, "maxItems", node.max_items);
    node.min_length = count(s, pointer, "minLength", 0);
    node.max_length = count(s, pointer, "maxLength", node.max_length);
    read_bounds(s, pointer, node);
    return node;
  }

  // Bounds compare as validators compare them (a JSON number read as a double, as JavaScript's are):
  // lo is the least number written with at most 15 fraction digits that passes the lower bound, hi
  // the greatest that passes the upper one. Integer nodes with bounds written as integers compare
  // exactly (as Python's validators do).
  void read_bounds(const ojson& s, const std::string& pointer, Node& node) const {
    const auto bound = [&](const char* keyword) -> const ojson* {
      const auto it = s.find(keyword);
      if (it == s.end() || it->is_boolean()) return nullptr;
      if (!it->is_number()) refuse(pointer, fmt::format("'{}' must be a number", keyword));
      return &*it;
    };
    // Draft 4 writes exclusive bounds as booleans beside minimum and maximum.
    const bool draft4_low = s.contains("exclusiveMinimum") && s["exclusiveMinimum"] == true;
    const bool draft4_high = s.contains("exclusiveMaximum") && s["exclusiveMaximum"] == true;
    const ojson *low = bound("minimum"), *high = bound("maximum");
    const ojson *low_exclusive = bound("exclusiveMinimum"), *high_exclusive = bound("exclusiveMaximum");
    if (draft4_low) low_exclusive = low, low = nullptr;
    if (draft4_high) high_exclusive = high, high = nullptr;
    if (!low && !high && !low_exclusive && !high_exclusive) return;
    if (!(node.types & (Node::kInteger | Node::kNumber))) return;  // (the bounds apply to numbers only)
    const bool integers = !(node.types & Node::kNumber);
    __int128 lo = -kLargest, hi = kLargest;
    if (low) lo = std::max(lo, first_passing(*low, false, integers));
    if (low_exclusive) lo = std::max(lo, first_passing(*low_exclusive, true, integers));
    if (high) hi = std::min(hi, last_passing(*high, false, integers));
    if (high_exclusive) hi = std::min(hi, last_passing(*high_exclusive, true, integers));
    if (lo > hi)
      refuse(pointer, fmt::format("no {} written with at most 19 integer digits{} lies within the bounds",
                                  integers ? "integer" : "number", integers ? "" : " and 15 fraction digits"));
    node.bounded = true;
    node.minimum = lo;
    node.maximum = hi;
  }

  // The least value (in units of 10^-15; integers: a whole one) greater than (`exclusive`) or equal to
  // `bound`; past the 19 digits, beyond them.
  static __int128 first_passing(const ojson& bound, bool exclusive, bool integers) {
    if (integers && (bound.is_number_integer() || bound.is_number_unsigned())) {
      const __int128 exact = bound.is_number_unsigned() ? __int128(bound.get<uint64_t>()) : __int128(bound.get<int64_t>());
      return std::clamp<__int128>((exact + (exclusive ? 1 : 0)) * kScale, -kLargest - 1, kLargest + 1);
    }
    const double b = bound.get<double>();
    const auto passes = [&](__int128 units) {
      const double v = as_double(units);
      return exclusive ? v > b : v >= b;
    };
    return integers ? search(b, passes, kScale) : search(b, passes, 1);
  }

  static __int128 last_passing(const ojson& bound, bool exclusive, bool integers) {
    if (integers && (bound.is_number_integer() || bound.is_number_unsigned())) {
      const __int128 exact = bound.is_number_unsigned() ? __int128(bound.get<uint64_t>()) : __int128(bound.get<int64_t>());
      return std::clamp<__int128>((exact - (exclusive ? 1 : 0)) * kScale, -kLargest - 1, kLargest + 1);
    }
    const double b = bound.get<double>();
    // The greatest passing value is one step below the least value past it.
    const auto beyond = [&](__int128 units) {
      const double v = as_double(units);
      return exclusive ? v >= b : v > b;
    };
    const __int128 step = integers ? kScale : 1;
    return search(b, beyond, step) - step;
  }

  // The least multiple of `step` (in units) for which `passes` holds (monotone: false, then true),
  // found by bisection around `b`; clamped past the 19 digits.
  template <typename Passes>
  static __int128 search(double b, const Passes& passes, __int128 step) {
    if (!(b > -1e19)) return -kLargest - 1;
    if (!(b < 1e19)) return kLargest + 1;
    __int128 low = -kLargest - 1, high = kLargest + 1;  // low fails (or is past the digits), high passes
    low = low / step * step - step;
    high = high / step * step + step;
    while (high - low > step) {
      __int128 middle = low + (high - low) / 2;
      middle -= ((middle % step) + step) % step;
      if (middle <= low) middle = low + step;
      if (passes(middle)) high = middle;
      else low = middle;
    }
    return std::clamp<__int128>(high, -kLargest - 1, kLargest + 1);
  }

  // A value in units of 10^-15 as a reader of its decimal text gets it (correctly rounded).
  static double as_double(__int128 units) {
    const bool negative = units < 0;
    unsigned __int128 magnitude = negative ? -static_cast<unsigned __int128>(units) : static_cast<unsigned __int128>(units);
    char digits[64];
    int n = 0;
    for (int i = 0; i < 16 || magnitude > 0; ++i, magnitude /= 10) {
      if (i == 15) digits[n++] = '.';
      digits[n++] = char('0' + int(magnitude % 10));
    }
    std::string text = negative ? "-" : "";
    for (int i = n - 1; i >= 0; --i) text += digits[i];
    return std::strtod(text.c_str(), nullptr);
  }

  static bool spells_marker(const ojson& value) {
    if (value.is_string()) return spells_gemma_marker(value.get<std::string>());
    if (value.is_object())
      for (const auto& [key, member] : value.items())
        if (spells_gemma_marker(key) || spells_marker(member)) return true;
    if (value.is_array())
      for (const ojson& item : value)
        if (spells_marker(item)) return true;
    return false;
  }

  static bool has_type(uint8_t types, const ojson& value) {
    switch (value.type()) {
      case ojson::value_t::null: return types & Node::kNull;
      case ojson::value_t::boolean: return types & Node::kBoolean;
      case ojson::value_t::number_integer:
      case ojson::value_t::number_unsigned: return types & (Node::kInteger | Node::kNumber);
      case ojson::value_t::number_float:
        return (types & Node::kNumber) || ((types & Node::kInteger) && value.get<double>() == std::floor(value.get<double>()));
      case ojson::value_t::string: return types & Node::kString;
      case ojson::value_t::array: return types & Node::kArray;
      case ojson::value_t::object: return types & Node::kObject;
      default: return false;
    }
  }

  static std::string pointer_token(const std::string& name) {
    std::string token;
    for (char c : name) token += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return token;
  }

  // A property's key as the output writes it: JSON-escaped between quotes, or in Gemma's syntax bare
  // (between <|"|> where a bare key could not hold it).
  std::string key_text(const std::string& name) const {
    if (!tool_arguments_) {
      const std::string quoted = ojson(name).dump();
      return quoted.substr(1, quoted.size() - 2);
    }
    if (!name.empty() && name.find_first_of(" \t\n\r,:{}[]") == std::string::npos) return name;
    return std::string(1, char(kGemmaQuoteByte)) + name + std::string(1, char(kGemmaQuoteByte));
  }

  std::vector<std::string> property_order(const ojson& properties) const {
    std::vector<std::string> names;
    if (!tool_arguments_) {
      for (const auto& [name, sub] : properties.items()) names.push_back(name);
      return names;
    }
    const nlohmann::json plain = nlohmann::json::parse(properties.dump());
    for (const auto& [name, value] : jinja::dictsort(plain)) names.push_back(*name);
    return names;
  }

  std::string literal(const ojson& value, const std::string& pointer) const {
    if (!tool_arguments_) return value.dump();
    if (spells_marker(value)) refuse(pointer, "a value that spells one of Gemma's markers cannot be written in a tool call");
    const std::string gemma = format_gemma_value(nlohmann::json::parse(value.dump()), false);
    std::string text;  // with the byte that stands for each <|"|>
    for (size_t at = 0; at < gemma.size();) {
      const size_t quote = gemma.find(kGemmaQuote, at);
      text.append(gemma, at, std::min(quote, gemma.size()) - at);
      if (quote == std::string::npos) break;
      text += char(kGemmaQuoteByte);
      at = quote + kGemmaQuote.size();
    }
    return text;
  }

  JsonGrammar& grammar_;
  const ojson& root_;
  std::string param_;
  bool tool_arguments_;
  int nesting_ = 0;
  std::map<std::string, int32_t> by_pointer_;
  int32_t any_ = -1;
};

}  // namespace

std::shared_ptr<const JsonGrammar> compile_json_schema(const ojson& schema, const std::string& param) {
  JsonGrammar grammar;
  SchemaCompiler compiler(grammar, schema, param, false);
  grammar.root = compiler.run();
  const std::vector<bool> has_values = prune(grammar);
  if (!has_values[size_t(grammar.root)]) compiler.refuse("", "the schema allows no value");
  if (!flatten_choices(grammar) || !compute_depths(grammar))
    compiler.refuse("", "the schema has too many choices (anyOf, $ref) to follow");
  if (grammar.nodes[size_t(grammar.root)].min_depth > 64)
    compiler.refuse("", "every value of the schema nests deeper than 64 levels");
  return std::make_shared<const JsonGrammar>(std::move(grammar));
}

std::shared_ptr<const JsonGrammar> compile_tool_calls(const nlohmann::json& tools, const std::string* only,
                                                      ToolCallGrammar::Thought thought, uint32_t max_calls) {
  JsonGrammar grammar;
  grammar.tool_calls_only = true;
  grammar.tool_calls.thought = thought;
  grammar.tool_calls.max_calls = only ? 1 : max_calls > 0 ? max_calls : std::numeric_limits<uint32_t>::max();
  std::vector<SchemaCompiler> compilers;
  std::vector<ojson> schemas;
  schemas.reserve(tools.size());
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::json& tool = tools[i];
    const nlohmann::json* function = tool.is_object() && tool.contains("function") ? &tool["function"] : nullptr;
    if (!function || !function->is_object() || !function->contains("name") || !(*function)["name"].is_string())
      continue;  // (the chat template refused these already)
    const std::string name = (*function)["name"];
    if (only && name != *only) continue;
    const auto parameters = function->find("parameters");
    schemas.push_back(parameters == function->end() || parameters->is_null()
                          ? ojson{{"type", "object"}, {"additionalProperties", false}}
                          : ojson::parse(parameters->dump()));
    SchemaCompiler compiler(grammar, schemas.back(), fmt::format("tools[{}].function.parameters", i), true);
    grammar.tool_calls.functions.push_back({name, compiler.run()});
    compilers.push_back(std::move(compiler));
  }
  if (grammar.tool_calls.functions.empty()) throw invalid_request("tools", "'tools' has no function to call");
  const std::vector<bool> has_values = prune(grammar);
  if (!flatten_choices(grammar) || !compute_depths(grammar))
    throw invalid_request("tools", "the tools' parameters have too many choices (anyOf, $ref) to follow");
  for (size_t f = 0; f < grammar.tool_calls.functions.size(); ++f) {
    const JsonSchemaNode& parameters = grammar.nodes[size_t(grammar.tool_calls.functions[f].parameters)];
    const auto object = [&](const JsonSchemaNode& node) {
      if (!node.literals.empty())
        return std::any_of(node.literals.begin(), node.literals.end(), [](const std::string& l) { return l[0] == '{'; });
      return (node.types & JsonSchemaNode::kObject) != 0;
    };
    const bool any_object = parameters.any_of.empty() ? object(parameters)
                                                       : std::any_of(parameters.any_of.begin(), parameters.any_of.end(),
                                                                     [&](int32_t a) { return object(grammar.nodes[size_t(a)]); });
    if (!has_values[size_t(grammar.tool_calls.functions[f].parameters)] || !any_object || parameters.min_depth > 63)
      compilers[f].refuse("", "the parameters allow no arguments object");
  }
  return std::make_shared<const JsonGrammar>(std::move(grammar));
}

}  // namespace tandem::server
