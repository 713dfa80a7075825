#include "runtime/json_prefix.h"

#include <algorithm>
#include <bit>
#include <limits>

#include "runtime/json_text.h"

namespace tandem {

using namespace json_text;

const JsonGrammar& JsonGrammar::any_object() {
  static const JsonGrammar grammar = [] {
    JsonGrammar g;
    g.nodes.resize(2);  // 0: any value; 1: any object
    g.nodes[0].other_properties = 0;
    g.nodes[0].items = 0;
    g.nodes[1] = g.nodes[0];
    g.nodes[1].types = JsonSchemaNode::kObject;
    g.root = 1;
    return g;
  }();
  return grammar;
}

JsonPrefix::JsonPrefix() : JsonPrefix(JsonGrammar::any_object()) {}

JsonPrefix::JsonPrefix(const JsonGrammar& grammar) : grammar_(&grammar) {
  Frame root;
  root.node = grammar.root;
  if (grammar.tool_calls_only) {
    root.mode = Mode::Calls;
    root.thought_passed = grammar.tool_calls.thought != ToolCallGrammar::Thought::Optional;
  }
  frames_.push_back(root);
  if (grammar.tool_calls_only && grammar.tool_calls.thought == ToolCallGrammar::Thought::Open)
    frames_.push_back(Frame{.mode = Mode::Thought});
  ends_.push_back(frames_.size());
}

void JsonPrefix::assign(const JsonPrefix& other) {
  grammar_ = other.grammar_;
  frames_ = other.frames_;
  ends_ = other.ends_;
}

bool JsonPrefix::feed(unsigned char c) {
  if (forked_.size() < size_t(kMaxForkLevels)) forked_.resize(size_t(kMaxForkLevels));
  next_frames_.clear();
  next_ends_.clear();
  size_t from = 0;
  for (size_t end : ends_) {
    const size_t begin = next_frames_.size();
    next_frames_.insert(next_frames_.end(), frames_.begin() + int64_t(from), frames_.begin() + int64_t(end));
    advance(begin, c, 0);
    from = end;
  }
  if (next_ends_.size() > 1) drop_repeated_ways();
  std::swap(frames_, next_frames_);
  std::swap(ends_, next_ends_);
  return !ends_.empty();
}

// Ways that reached the same stack (overlapping anyOf branches) are one; past kMaxWays the latest are
// dropped, which narrows the choice and never strands the output (each way left can still complete).
void JsonPrefix::drop_repeated_ways() {
  size_t kept_frames = 0, kept = 0, from = 0;
  for (size_t i = 0; i < next_ends_.size(); ++i) {
    const size_t end = next_ends_[i], size = end - from;
    bool repeated = kept == kMaxWays;
    for (size_t k = 0, other = 0; k < kept && !repeated; other = next_ends_[k++])
      repeated = next_ends_[k] - other == size &&
                 std::equal(next_frames_.begin() + int64_t(other), next_frames_.begin() + int64_t(next_ends_[k]),
                            next_frames_.begin() + int64_t(from));
    if (!repeated) {
      std::copy(next_frames_.begin() + int64_t(from), next_frames_.begin() + int64_t(end),
                next_frames_.begin() + int64_t(kept_frames));
      kept_frames += size;
      next_ends_[kept++] = kept_frames;
    }
    from = end;
  }
  next_frames_.resize(kept_frames);
  next_ends_.resize(kept);
}

// Feeds c to the stack at next_frames_[begin, end()), the last one there: on success it stays (as
// one or, forked, several stacks, each ended in next_ends_), on failure it is removed.
void JsonPrefix::advance(size_t begin, unsigned char c, int level) {
  std::vector<Frame>& stack = next_frames_;
  const auto fail = [&] { stack.resize(begin); };
  const auto ok = [&] { next_ends_.push_back(stack.size()); };
  for (;;) {
    if (stack.size() == begin) return fail();  // the value is complete: nothing follows it
    Frame& f = stack.back();
    const JsonSchemaNode& node = grammar_->nodes[size_t(f.node)];
    const size_t depth = stack.size() - begin;
    const bool structural = f.mode == Mode::Value || f.mode == Mode::ObjectFirst || f.mode == Mode::ObjectKey ||
                            f.mode == Mode::Colon || f.mode == Mode::AfterMember || f.mode == Mode::ArrayFirst ||
                            f.mode == Mode::AfterItem;
    if (structural) {
      // (Gemma's syntax as the template writes it has no whitespace: a model need not spend tokens on it.)
      if (is_space(c) && grammar_->tool_calls_only) return fail();
      if (is_space(c)) {
        if (depth == 1 && f.mode == Mode::Value) return fail();  // nothing before the value
        return ++f.spaces <= kMaxSpaces ? ok() : fail();
      }
      f.spaces = 0;
    }
    switch (f.mode) {
      case Mode::Value:
        if (!node.any_of.empty()) return fork(begin, c, level);
        if (!node.literals.empty()) {
          f.mode = Mode::Literal;
          f.which = 0;
          f.literals_end = uint32_t(node.literals.size());
          f.count = 0;
          continue;
        }
        return begin_value(f, c, depth) ? ok() : fail();
      case Mode::ObjectFirst:
      case Mode::ObjectKey: {
        if (c == '}' && f.mode == Mode::ObjectFirst) {
          if (int64_t(f.count) <= last_required(node)) return fail();
          end_value(begin);
          return ok();
        }
        const bool gemma = grammar_->tool_calls_only;  // (keys bare: c is the key's first byte)
        if (!gemma && c != '"') return fail();
        Frame key;
        key.node = f.node;
        if (!node.properties.empty()) {
          for (size_t j = f.count; j < node.properties.size() && j - f.count < 64; ++j) {
            if (node.properties[j].required || fits(node.properties[j].node, depth))
              key.candidates |= uint64_t(1) << (j - f.count);
            if (node.properties[j].required) break;
          }
          if (key.candidates == 0) return fail();
          key.mode = Mode::Key;
          key.which = int32_t(f.count);
        } else {
          if (node.other_properties < 0 || !fits(node.other_properties, depth)) return fail();
          key.mode = Mode::String;
          key.key = true;
        }
        stack.push_back(key);
        if (gemma) continue;
        return ok();
      }
      case Mode::Key: {
        const auto& properties = node.properties;
        uint64_t matching = 0;
        for (uint64_t bits = f.candidates; bits != 0; bits &= bits - 1) {
          const size_t j = size_t(f.which) + size_t(std::countr_zero(bits));
          const std::string& key = properties[j].key;
          if (c == (grammar_->tool_calls_only ? ':' : '"') && key.size() == f.count) {
            stack.pop_back();
            key_ended(int32_t(j));
            return ok();
          }
          if (f.count < key.size() && static_cast<unsigned char>(key[f.count]) == c) matching |= bits & -bits;
        }
        if (matching == 0) return fail();
        f.candidates = matching;
        ++f.count;
        return ok();
      }
      case Mode::Colon: {
        if (c != ':') return fail();
        f.mode = Mode::Member;
        Frame value;
        value.node = f.which >= 0 ? node.properties[size_t(f.which)].node : node.other_properties;
        stack.push_back(value);
        return ok();
      }
      case Mode::AfterMember:
        if (c == ',') {
          if (!node.properties.empty() && f.count >= node.properties.size()) return fail();
          f.mode = Mode::ObjectKey;
          return ok();
        }
        if (c != '}' || int64_t(f.count) <= last_required(node)) return fail();
        end_value(begin);
        return ok();
      case Mode::ArrayFirst:
        if (c == ']') {
          if (node.min_items > 0) return fail();
          end_value(begin);
          return ok();
        }
        if (node.max_items == 0 || !fits(node.items, depth)) return fail();
        f.mode = Mode::Item;
        stack.push_back(Frame{.node = node.items});
        continue;  // c begins the item
      case Mode::AfterItem:
        if (c == ',') {
          if (f.count >= node.max_items || !fits(node.items, depth)) return fail();
          f.mode = Mode::Item;
          stack.push_back(Frame{.node = node.items});
          return ok();
        }
        if (c != ']' || f.count < node.min_items) return fail();
        end_value(begin);
        return ok();
      case Mode::String:
      case Mode::Escape:
      case Mode::Unicode: {
        bool ended = false;
        if (!string(f, c, ended)) return fail();
        if (ended && f.key) {
          stack.pop_back();
          key_ended(-1);
        } else if (ended) {
          end_value(begin);
        }
        return ok();
      }
      case Mode::Number: {
        bool ended = false;
        if (!number(f, c, ended)) return fail();
        if (!ended) return ok();
        end_value(begin);
        continue;  // the byte after the number goes on to the value around it
      }
      case Mode::Literal: {
        if (f.which < 0) {  // true, false, null
          const std::string& text = kLiteralTexts[size_t(-f.which - 1)];
          if (f.count >= text.size() || c != static_cast<unsigned char>(text[f.count])) return fail();
          if (++f.count == text.size()) end_value(begin);
          return ok();
        }
        // The node's literals still matching share the bytes so far and, sorted, lie in a range: the
        // one that ended here first (the caller's choice forked there), then by their next byte.
        const auto& literals = node.literals;
        const size_t at = f.count;
        auto first = literals.begin() + f.which, last = literals.begin() + f.literals_end;
        if (first != last && first->size() == at) ++first;
        const auto byte_at = [at](const std::string& text) { return static_cast<unsigned char>(text[at]); };
        first = std::partition_point(first, last, [&](const std::string& t) { return byte_at(t) < c; });
        last = std::partition_point(first, last, [&](const std::string& t) { return byte_at(t) == c; });
        if (first == last) return fail();
        f.which = int32_t(first - literals.begin());
        f.literals_end = uint32_t(last - literals.begin());
        ++f.count;
        if (first->size() != f.count) return ok();
        if (last - first == 1) {
          end_value(begin);
          return ok();
        }
        // One literal ends here and longer ones go on ("1" and "12"): both ways.
        ok();
        const size_t copy = stack.size();
        stack.reserve(copy + (copy - begin));
        for (size_t i = begin; i < copy; ++i) stack.push_back(stack[i]);
        end_value(copy);
        return ok();
      }
      case Mode::Calls: {
        const ToolCallGrammar& calls = grammar_->tool_calls;
        if (c == kChannelOpenByte && !f.thought_passed && f.count == 0) {
          f.thought_passed = true;
          stack.push_back(Frame{.mode = Mode::Thought});
          return ok();
        }
        if (c != kToolCallOpenByte || f.count >= calls.max_calls) return fail();
        f.thought_passed = true;
        Frame name{.mode = Mode::CallName};
        for (size_t j = 0; j < calls.functions.size() && j < 64; ++j) name.candidates |= uint64_t(1) << j;
        stack.push_back(name);
        return ok();
      }
      case Mode::Thought:  // any text, to the channel's end or the first call
        if (c == kToolCallOpenByte) {
          stack.pop_back();
          continue;
        }
        if (c == kChannelCloseByte) {
          stack.pop_back();
          return ok();
        }
        if (c >= kGemmaQuoteByte) return fail();
        f.marker = next_marker_state(f.marker, c);
        return f.marker == kSpelled ? fail() : ok();
      case Mode::CallName: {
        static constexpr std::string_view kCall = "call:";
        if (f.count < kCall.size()) {
          if (c != static_cast<unsigned char>(kCall[f.count])) return fail();
          ++f.count;
          return ok();
        }
        const auto& functions = grammar_->tool_calls.functions;
        const size_t at = f.count - kCall.size();
        uint64_t matching = 0;
        for (uint64_t bits = f.candidates; bits != 0; bits &= bits - 1) {
          const size_t j = size_t(std::countr_zero(bits));
          const std::string& name = functions[j].name;
          if (c == '{' && name.size() == at) {  // the arguments begin
            stack.pop_back();
            stack.back().mode = Mode::CallArguments;
            stack.back().which = int32_t(j);
            stack.push_back(Frame{.node = functions[j].parameters});
            break;
          }
          if (at < name.size() && static_cast<unsigned char>(name[at]) == c) matching |= bits & -bits;
        }
        if (stack.back().mode == Mode::Value) continue;  // c opens the arguments
        if (matching == 0) return fail();
        f.candidates = matching;
        ++f.count;
        return ok();
      }
      case Mode::AfterCall:
        if (c != kToolCallCloseByte) return fail();
        f.mode = Mode::Calls;
        ++f.count;
        return ok();
      case Mode::Member:
      case Mode::Item:
      case Mode::CallArguments: return fail();  // (below the value being read: never fed)
    }
    return fail();
  }
}

// A value of a node with choices (anyOf): one stack per choice that c can begin.
void JsonPrefix::fork(size_t begin, unsigned char c, int level) {
  std::vector<Frame>& stack = next_frames_;
  if (level + 1 >= kMaxForkLevels) return stack.resize(begin);
  std::vector<Frame>& saved = forked_[size_t(level)];
  saved.assign(stack.begin() + int64_t(begin), stack.end());
  stack.resize(begin);
  const Frame top = saved.back();
  const JsonSchemaNode& node = grammar_->nodes[size_t(top.node)];
  const auto follow = [&](const Frame& choice) {
    const size_t at = stack.size();
    stack.insert(stack.end(), saved.begin(), saved.end() - 1);
    stack.push_back(choice);
    advance(at, c, level + 1);
  };
  for (int32_t alternative : node.any_of) {
    Frame choice = top;
    choice.node = alternative;
    follow(choice);
  }
}

// An object's key ended (`property` -1: an undeclared one); in Gemma's syntax with its ':'.
void JsonPrefix::key_ended(int32_t property) {
  Frame& object = next_frames_.back();
  object.which = property;
  if (!grammar_->tool_calls_only) {
    object.mode = Mode::Colon;
    return;
  }
  const JsonSchemaNode& node = grammar_->nodes[size_t(object.node)];
  object.mode = Mode::Member;
  next_frames_.push_back(Frame{.node = property >= 0 ? node.properties[size_t(property)].node : node.other_properties});
}

bool JsonPrefix::fits(int32_t node, size_t depth) const {
  return depth + grammar_->nodes[size_t(node)].min_depth <= size_t(kMaxDepth);
}

bool JsonPrefix::begin_value(Frame& f, unsigned char c, size_t depth) const {
  const JsonSchemaNode& node = grammar_->nodes[size_t(f.node)];
  const uint8_t types = node.types;
  if (c == (grammar_->tool_calls_only ? kGemmaQuoteByte : '"')) {
    if (!(types & JsonSchemaNode::kString)) return false;
    f.mode = Mode::String;
    f.count = 0;
    return true;
  }
  switch (c) {
    case '{':
      if (!(types & JsonSchemaNode::kObject) || depth - 1 + node.min_object_depth > size_t(kMaxDepth)) return false;
      f.mode = Mode::ObjectFirst;
      f.count = 0;
      return true;
    case '[':
      if (!(types & JsonSchemaNode::kArray) || depth - 1 + node.min_array_depth > size_t(kMaxDepth)) return false;
      f.mode = Mode::ArrayFirst;
      f.count = 0;
      return true;
    case 't':
    case 'f':
    case 'n':
      if (!(types & (c == 'n' ? JsonSchemaNode::kNull : JsonSchemaNode::kBoolean))) return false;
      f.mode = Mode::Literal;
      f.which = c == 't' ? kTrue : c == 'f' ? kFalse : kNull;
      f.count = 1;
      return true;
    default:
      if ((c != '-' && !is_digit(c)) || !(types & (JsonSchemaNode::kInteger | JsonSchemaNode::kNumber))) return false;
      f.mode = Mode::Number;
      f.negative = c == '-';
      f.step = c == '-' ? Minus : c == '0' ? Zero : Integer;
      f.digits = c == '-' ? 0 : 1;
      f.magnitude = c == '-' ? 0 : uint64_t(c - '0');
      return number_reachable(f);
  }
}

void JsonPrefix::end_value(size_t begin) {
  next_frames_.pop_back();
  if (next_frames_.size() == begin) return;  // the whole value
  Frame& around = next_frames_.back();
  if (around.mode == Mode::CallArguments) {
    around.mode = Mode::AfterCall;
  } else if (around.mode == Mode::Member) {
    if (around.which >= 0) around.count = uint32_t(around.which) + 1;
    around.mode = Mode::AfterMember;
  } else {
    ++around.count;
    around.mode = Mode::AfterItem;
  }
}

bool JsonPrefix::complete() const {
  size_t from = 0;
  for (size_t end : ends_) {
    if (end == from) return true;
    if (end - from == 1 && frames_[from].mode == Mode::Number && number_complete(frames_[from])) return true;
    if (end - from == 1 && frames_[from].mode == Mode::Calls && frames_[from].count > 0) return true;
    from = end;
  }
  return false;
}

int64_t JsonPrefix::string_content_room() const {
  if (ends_.size() != 1 || frames_.empty()) return -1;
  const Frame& f = frames_.back();
  if (f.marker != 0) return -1;  // (the next bytes may complete a marker)
  if (f.mode == Mode::Thought) return std::numeric_limits<int64_t>::max();
  if (f.mode != Mode::String || f.utf8_left != 0 || f.need_low) return -1;
  if (f.key) return grammar_->tool_calls_only ? -1 : std::numeric_limits<int64_t>::max();
  return int64_t(grammar_->nodes[size_t(f.node)].max_length) - int64_t(f.count);
}

}  // namespace tandem
