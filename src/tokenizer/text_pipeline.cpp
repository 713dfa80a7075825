#include "tokenizer/text_pipeline.h"

#include <algorithm>

namespace tandem::tok {

void Normalizer::apply(std::string_view text, std::string& out) const {
  out.assign(text);
  std::string next;
  for (const Replacement& r : replacements) {
    if (out.find(r.pattern) == std::string::npos) continue;
    next.clear();
    next.reserve(out.size() + out.size() / 2);
    size_t start = 0;
    for (size_t hit; (hit = out.find(r.pattern, start)) != std::string::npos; start = hit + r.pattern.size()) {
      next.append(out, start, hit - start);
      next += r.content;
    }
    next.append(out, start, std::string::npos);
    out.swap(next);
  }
}

std::vector<std::string_view>& PreTokenizer::pieces_scratch() {
  thread_local std::vector<std::string_view> pieces;
  return pieces;
}

// Mirrors tokenizers' NormalizedString::split: the text is cut into alternating non-match and
// match spans (no empty ones), the behavior decides where matches go, and empty pieces are dropped.
void PreTokenizer::split_into(std::string_view text, std::vector<std::string_view>& pieces) const {
  struct Span {
    size_t begin, end;
    bool is_match;
  };
  std::vector<Span> spans;
  size_t last_end = 0;
  for (size_t hit; (hit = text.find(pattern, last_end)) != std::string_view::npos; last_end = hit + pattern.size()) {
    if (hit != last_end) spans.push_back({last_end, hit, false});
    spans.push_back({hit, hit + pattern.size(), true});
  }
  if (last_end != text.size()) spans.push_back({last_end, text.size(), false});

  std::vector<Span> merged;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const Span& s : spans)
        if (!s.is_match) merged.push_back(s);
      break;
    case SplitBehavior::kIsolated:
      merged = spans;
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !merged.empty())
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !merged.empty())
          merged.back().begin = it->begin;
        else
          merged.push_back(*it);
        previous_match = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !merged.empty())
          merged.back().end = s.end;
        else
          merged.push_back(s);
        previous_match = s.is_match;
      }
      break;
  }
  pieces.clear();
  for (const Span& s : merged)
    if (s.end > s.begin) pieces.push_back(text.substr(s.begin, s.end - s.begin));
}

}  // namespace tandem::tok
