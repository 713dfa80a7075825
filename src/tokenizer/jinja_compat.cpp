#include "tokenizer/jinja_compat.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "tokenizer/utf8.h"

namespace tandem::jinja {

using nlohmann::json;

const json* lookup(const json* value, std::string_view key) {
  if (value == nullptr || !value->is_object()) return nullptr;
  auto it = value->find(key);
  return it == value->end() ? nullptr : &*it;
}

const json* lookup(const json& value, std::string_view key) { return lookup(&value, key); }

bool truthy(const json* value) {
  if (value == nullptr) return false;
  switch (value->type()) {
    case json::value_t::null: return false;
    case json::value_t::boolean: return value->get<bool>();
    case json::value_t::number_integer: return value->get<int64_t>() != 0;
    case json::value_t::number_unsigned: return value->get<uint64_t>() != 0;
    case json::value_t::number_float: return value->get<double>() != 0.0;
    case json::value_t::string: return !value->get_ref<const std::string&>().empty();
    case json::value_t::array:
    case json::value_t::object: return !value->empty();
    default: return true;
  }
}

namespace {

// Python's str.isspace(): the code points of bidirectional class WS, B or S, or category Zs.
bool is_python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Start of the code point that ends at `end` (exclusive) in valid UTF-8.
size_t previous_code_point_start(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

uint32_t code_point_at(std::string_view text, size_t pos, int* length) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data()) + pos;
  *length = std::min<int>(utf8::sequence_length(*p), int(text.size() - pos));
  return utf8::decode_valid(p, *length);
}

// Lower-casing for dictsort covers the scripts whose case pairs can reorder keys in practice: ASCII,
// Latin-1, Latin Extended-A, Greek and Cyrillic. Other code points compare as they are.
uint32_t lower_code_point(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 0x20;
  if (c < 0xC0) return c;
  if (c <= 0xDE) return c == 0xD7 ? c : c + 0x20;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';  // Python gives "i\u0307"; its first code point decides the order
    if (c == 0x178) return 0xFF;
    const bool even_upper = (c <= 0x137) || (c >= 0x14A && c <= 0x177);
    const bool odd_upper = (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E);
    if ((even_upper && c % 2 == 0) || (odd_upper && c % 2 == 1)) return c + 1;
    return c;
  }
  if (c >= 0x391 && c <= 0x3AB && c != 0x3A2) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  return c;
}

std::string lower_for_sorting(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    int length = 0;
    const uint32_t c = code_point_at(text, pos, &length);
    utf8::append(out, lower_code_point(c));
    pos += size_t(length);
  }
  return out;
}

// Python's str.isprintable(), closely enough for repr(): controls, separators other than the space,
// format characters and the BOM are escaped.
bool is_python_printable(uint32_t c) {
  if (c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD) return false;
  if (c == 0x1680 || (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F)) return false;
  if ((c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF) return false;
  return true;
}

void append_python_repr(std::string& out, const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (size_t pos = 0; pos < text.size();) {
    int length = 0;
    const uint32_t c = code_point_at(text, pos, &length);
    char escape[16];
    if (c == uint32_t(quote) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (!is_python_printable(c)) {
      if (c <= 0xFF)
        std::snprintf(escape, sizeof escape, "\\x%02x", unsigned(c));
      else if (c <= 0xFFFF)
        std::snprintf(escape, sizeof escape, "\\u%04x", unsigned(c));
      else
        std::snprintf(escape, sizeof escape, "\\U%08x", unsigned(c));
      out += escape;
    } else {
      out.append(text, pos, size_t(length));
    }
    pos += size_t(length);
  }
  out += quote;
}

void append_python_repr(std::string& out, const json& value) {
  switch (value.type()) {
    case json::value_t::string: append_python_repr(out, value.get_ref<const std::string&>()); return;
    case json::value_t::array: {
      out += '[';
      bool first = true;
      for (const json& item : value) {
        if (!first) out += ", ";
        first = false;
        append_python_repr(out, item);
      }
      out += ']';
      return;
    }
    case json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : value.items()) {
        if (!first) out += ", ";
        first = false;
        append_python_repr(out, key);
        out += ": ";
        append_python_repr(out, item);
      }
      out += '}';
      return;
    }
    default: out += python_str(value); return;
  }
}

}  // namespace

std::string trim(std::string_view text) {
  size_t begin = 0;
  while (begin < text.size()) {
    int length = 0;
    if (!is_python_space(code_point_at(text, begin, &length))) break;
    begin += size_t(length);
  }
  size_t end = text.size();
  while (end > begin) {
    const size_t start = previous_code_point_start(text, end);
    int length = 0;
    if (!is_python_space(code_point_at(text, start, &length))) break;
    end = start;
  }
  return std::string(text.substr(begin, end - begin));
}

std::string upper(const json* value) {
  if (value == nullptr) return "";
  std::string text = python_str(*value);
  for (char& c : text)
    if (c >= 'a' && c <= 'z') c = char(c - 0x20);
  return text;
}

// repr(float) in Python 3: the shortest digits that round-trip, written positionally when the
// decimal exponent is in [-4, 16) and with an exponent of at least two digits otherwise.
std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value < 0 ? "-inf" : "inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value, std::chars_format::scientific);
  const std::string_view scientific(buffer, size_t(end - buffer));  // "-d.ddde+XX"
  const size_t e = scientific.find('e');
  std::string_view mantissa = scientific.substr(0, e);
  int exponent = std::stoi(std::string(scientific.substr(e + 1)));
  std::string sign;
  if (!mantissa.empty() && mantissa.front() == '-') {
    sign = "-";
    mantissa.remove_prefix(1);
  }
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  const int point = exponent + 1;  // digits are 0.DIGITS x 10^point
  const int count = int(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) return sign + "0." + std::string(size_t(-point), '0') + digits;
    if (point >= count) return sign + digits + std::string(size_t(point - count), '0') + ".0";
    return sign + digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
  }
  std::string out = sign + digits.substr(0, 1);
  if (count > 1) out += "." + digits.substr(1);
  char exponent_text[16];
  std::snprintf(exponent_text, sizeof exponent_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exponent_text;
}

std::string python_str(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return "None";
    case json::value_t::boolean: return value.get<bool>() ? "True" : "False";
    case json::value_t::number_integer: return std::to_string(value.get<int64_t>());
    case json::value_t::number_unsigned: return std::to_string(value.get<uint64_t>());
    case json::value_t::number_float: return python_float_repr(value.get<double>());
    case json::value_t::string: return value.get<std::string>();
    default: {
      std::string out;
      append_python_repr(out, value);
      return out;
    }
  }
}

std::vector<std::pair<const std::string*, const json*>> dictsort(const json& object) {
  struct Entry {
    std::string sort_key;
    const std::string* key;
    const json* value;
  };
  std::vector<Entry> entries;
  for (auto it = object.begin(); it != object.end(); ++it)
    entries.push_back({lower_for_sorting(it.key()), &it.key(), &it.value()});
  // Stable, as Python's sorted(): keys equal once lower-cased keep the object's order.
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.sort_key < b.sort_key; });
  std::vector<std::pair<const std::string*, const json*>> sorted;
  sorted.reserve(entries.size());
  for (const Entry& entry : entries) sorted.emplace_back(entry.key, entry.value);
  return sorted;
}

}  // namespace tandem::jinja
