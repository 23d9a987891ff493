// text/utf8.h — UTF-8 validation and repair, code point helpers, and NFC.
//
// Invalid UTF-8 is REPAIRED, never refused: each maximal ill-formed subsequence (Unicode §3.9, "U+FFFD
// substitution of maximal subparts") becomes one U+FFFD. This is what Python's errors="replace", the
// WHATWG TextDecoder (node) and Rust's String::from_utf8_lossy do, so bytes that a HF pipeline would
// first decode with replacement give the same text here. Overlong forms, surrogates (ED A0..BF) and
// code points above U+10FFFF are ill-formed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lt {

inline constexpr char32_t kReplacementChar = 0xFFFD;

// Length (1..4) of the well-formed sequence starting at p[0], p[n-1] being the last byte available, or
// 0 when it is ill-formed; then *bad is the length of its maximal subpart (>= 1), the bytes one U+FFFD
// replaces.
int utf8_sequence_length(const unsigned char* p, size_t n, int* bad);

bool utf8_is_valid(std::string_view s);

// `s` with every maximal ill-formed subsequence replaced by U+FFFD (EF BF BD). Valid input is returned
// unchanged.
std::string utf8_repair(std::string_view s);

// The code point of the well-formed sequence at p (length from utf8_sequence_length).
char32_t utf8_decode(const unsigned char* p, int length);

// Appends the UTF-8 encoding of cp (cp <= 0x10FFFF, not a surrogate).
void utf8_append(std::string& out, char32_t cp);

// Unicode White_Space (PropList.txt): what lstrip/rstrip of added tokens remove, as Rust's
// char::is_whitespace.
bool is_unicode_whitespace(char32_t cp);

// NFC of valid UTF-8 (utf8proc). Returns a view of `s` itself when it is already NFC for a cheap
// reason (no byte >= 0xCC: every code point is below U+0300, and those neither decompose nor compose),
// else of `storage`, which it fills.
std::string_view nfc(std::string_view s, std::string& storage);
std::string nfc(std::string_view s);

}  // namespace lt
