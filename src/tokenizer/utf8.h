#pragma once
// UTF-8 helpers for the tokenizer: walking code points of text already known to be valid, and
// turning arbitrary bytes into valid text the way WHATWG's TextDecoder does (the decoder that the
// peer @huggingface/tokenizers uses for byte-fallback tokens, and Rust's from_utf8_lossy too).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::utf8 {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

// Byte length of the sequence that starts with lead byte `b` of VALID UTF-8.
inline int sequence_length(unsigned char b) {
  if (b < 0x80) return 1;
  if (b < 0xE0) return 2;
  if (b < 0xF0) return 3;
  return 4;
}

// Decodes the code point at the start of VALID UTF-8 `p` (of `length` bytes, from sequence_length).
inline uint32_t decode_valid(const unsigned char* p, int length) {
  switch (length) {
    case 1: return p[0];
    case 2: return (uint32_t(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    case 3: return (uint32_t(p[0] & 0x0F) << 12) | (uint32_t(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    default:
      return (uint32_t(p[0] & 0x07) << 18) | (uint32_t(p[1] & 0x3F) << 12) | (uint32_t(p[2] & 0x3F) << 6) |
             (p[3] & 0x3F);
  }
}

void append(std::string& out, uint32_t code_point);

// True when `text` is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF).
bool is_valid(std::string_view text);

// Appends `bytes` decoded as UTF-8 to `out`, each maximal invalid subpart becoming one U+FFFD.
// With final == false an incomplete but so far valid sequence at the end is left alone, for the
// caller to complete with more bytes; the return value is the number of bytes consumed.
size_t decode_lossy(std::string_view bytes, bool final, std::string& out);

// `text` when valid, else its lossy decoding.
std::string make_valid(std::string_view text);

}  // namespace tandem::utf8
