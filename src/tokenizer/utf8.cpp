#include "tokenizer/utf8.h"

#include <cstring>

namespace tandem::utf8 {

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

// The WHATWG "UTF-8 decode" state machine, one byte at a time. The accepted range of the next
// continuation byte is narrowed after E0/ED/F0/F4 so that overlongs, surrogates and values past
// U+10FFFF are rejected at the first byte that proves them wrong: that is what makes each maximal
// invalid subpart one U+FFFD.
struct Decoder {
  uint32_t code_point = 0;
  int needed = 0;
  int seen = 0;
  unsigned char lower = 0x80;
  unsigned char upper = 0xBF;

  void reset() {
    code_point = 0;
    needed = seen = 0;
    lower = 0x80;
    upper = 0xBF;
  }
};

}  // namespace

size_t decode_lossy(std::string_view bytes, bool final, std::string& out) {
  Decoder d;
  size_t sequence_start = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    const unsigned char b = static_cast<unsigned char>(bytes[i]);
    if (d.needed == 0) {
      sequence_start = i;
      ++i;
      if (b < 0x80) {
        out += char(b);
      } else if (b >= 0xC2 && b <= 0xDF) {
        d.needed = 1;
        d.code_point = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) d.lower = 0xA0;
        if (b == 0xED) d.upper = 0x9F;
        d.needed = 2;
        d.code_point = b & 0x0F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) d.lower = 0x90;
        if (b == 0xF4) d.upper = 0x8F;
        d.needed = 3;
        d.code_point = b & 0x07;
      } else {
        append(out, kReplacementChar);
      }
      continue;
    }
    if (b < d.lower || b > d.upper) {
      // The sequence so far is the maximal invalid subpart; `b` starts afresh (not consumed).
      d.reset();
      append(out, kReplacementChar);
      continue;
    }
    ++i;
    d.lower = 0x80;
    d.upper = 0xBF;
    d.code_point = (d.code_point << 6) | (b & 0x3F);
    if (++d.seen == d.needed) {
      append(out, d.code_point);
      d.reset();
    }
  }
  if (d.needed == 0) return bytes.size();
  if (!final) return sequence_start;
  append(out, kReplacementChar);
  return bytes.size();
}

bool is_valid(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // Most text is ASCII: skip it eight bytes at a time.
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, p + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    int length;
    unsigned char lower = 0x80, upper = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      length = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      length = 3;
      if (b == 0xE0) lower = 0xA0;
      if (b == 0xED) upper = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      length = 4;
      if (b == 0xF0) lower = 0x90;
      if (b == 0xF4) upper = 0x8F;
    } else {
      return false;
    }
    if (i + length > n) return false;
    if (p[i + 1] < lower || p[i + 1] > upper) return false;
    for (int k = 2; k < length; ++k)
      if ((p[i + k] & 0xC0) != 0x80) return false;
    i += length;
  }
  return true;
}

std::string make_valid(std::string_view text) {
  if (is_valid(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  decode_lossy(text, /*final=*/true, out);
  return out;
}

}  // namespace tandem::utf8
