// Tests for text/utf8.h and the byte-level alphabet of text/bpe.h: repair by maximal subparts (the
// Unicode standard's own example), validity, NFC and its fast path, whitespace, the 256-character
// alphabet.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "text/bpe.h"
#include "text/utf8.h"

namespace lt {
namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, RepairFollowsTheStandardsExample) {
  // Unicode 15, §3.9, Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 becomes
  // a FFFD FFFD FFFD b FFFD c FFFD FFFD d (one replacement per maximal subpart).
  std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  EXPECT_FALSE(utf8_is_valid(in));
  EXPECT_EQ(utf8_repair(in), "a" + kFFFD + kFFFD + kFFFD + "b" + kFFFD + "c" + kFFFD + kFFFD + "d");
}

TEST(Utf8, RepairOfEachKindOfError) {
  struct Case {
    std::string in;
    int replacements;
  };
  std::vector<Case> cases = {
      {"\xC0\xAF", 2},          // overlong: C0 never starts a sequence
      {"\xE0\x80\xAF", 3},      // overlong 3-byte: E0 needs A0..BF next
      {"\xED\xA0\x80", 3},      // a surrogate: ED needs 80..9F next
      {"\xF4\x90\x80\x80", 4},  // above U+10FFFF
      {"\xF5\x80", 2},          // F5 never starts a sequence
      {"\xFF", 1},
      {"\xE4\xBD", 1},          // truncated at the end: one maximal subpart
      {"\xF0\x9F\x98", 1},
      {"\x80", 1},
  };
  for (const Case& c : cases) {
    std::string expected;
    for (int i = 0; i < c.replacements; ++i) expected += kFFFD;
    EXPECT_FALSE(utf8_is_valid(c.in));
    EXPECT_EQ(utf8_repair(c.in), expected) << testing::PrintToString(c.in);
    EXPECT_TRUE(utf8_is_valid(utf8_repair(c.in)));
  }
}

TEST(Utf8, ValidTextIsUnchangedAndRoundTrips) {
  std::mt19937 rng(3);
  for (int t = 0; t < 200; ++t) {
    std::string s;
    std::vector<char32_t> cps;
    for (int k = 0; k < 50; ++k) {
      char32_t cp;
      do cp = char32_t(rng() % 4 == 0 ? rng() % 0x110000 : rng() % 0x800);
      while (cp >= 0xD800 && cp <= 0xDFFF);
      cps.push_back(cp);
      utf8_append(s, cp);
    }
    ASSERT_TRUE(utf8_is_valid(s));
    EXPECT_EQ(utf8_repair(s), s);
    // Decode back code point by code point.
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    size_t i = 0;
    for (char32_t cp : cps) {
      int bad = 0;
      int len = utf8_sequence_length(p + i, s.size() - i, &bad);
      ASSERT_GT(len, 0);
      EXPECT_EQ(utf8_decode(p + i, len), cp);
      i += size_t(len);
    }
  }
  EXPECT_TRUE(utf8_is_valid(std::string("a\0b", 3)));  // NUL is a character
}

TEST(Utf8, Nfc) {
  EXPECT_EQ(nfc("e\u0301"), "\u00e9");
  EXPECT_EQ(nfc("\u212b"), "\u00c5");                   // Angstrom sign -> A with ring
  EXPECT_EQ(nfc("\u1112\u1161\u11ab"), "\ud55c");       // Hangul jamo -> 한
  EXPECT_EQ(nfc("a\u0328\u0301"), "\u0105\u0301");      // canonical order, then composition
  EXPECT_EQ(nfc("\u00e9\u4e2d\U0001F600"), "\u00e9\u4e2d\U0001F600");  // already NFC
  // The fast path: no byte >= 0xCC means no code point >= U+0300; the input itself is returned.
  std::string ascii = "plain ascii text, Latin-1 \u00e9\u00fc and nothing else";
  std::string storage;
  EXPECT_EQ(nfc(ascii, storage).data(), ascii.data());
  EXPECT_EQ(nfc(std::string("x\0y", 3)), std::string("x\0y", 3));
}

TEST(Utf8, UnicodeWhitespace) {
  for (char32_t c : {0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x2029,
                     0x202F, 0x205F, 0x3000})
    EXPECT_TRUE(is_unicode_whitespace(c)) << std::hex << uint32_t(c);
  for (char32_t c : {0x00, 0x1C, 0x1F, 0x41, 0x200B, 0x180E, 0xFEFF, 0x3001})
    EXPECT_FALSE(is_unicode_whitespace(c)) << std::hex << uint32_t(c);
}

TEST(ByteLevelAlphabet, IsABijectionOfPrintableCharacters) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b) {
    char32_t c = byte_to_unicode(uint8_t(b));
    EXPECT_TRUE(seen.insert(c).second);
    EXPECT_EQ(unicode_to_byte(c), b);
    EXPECT_GT(c, 0x20u);  // never a space or a control character
  }
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);   // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), 0x10Au);  // Ċ
  EXPECT_EQ(byte_to_unicode('a'), char32_t('a'));
  EXPECT_EQ(byte_level_encode(" world\n"), "\u0120world\u010a");
  EXPECT_EQ(byte_level_decode("\u0120world\u010a"), " world\n");
  EXPECT_EQ(byte_level_decode("has space"), std::nullopt);  // U+0020 is not in the alphabet
  EXPECT_EQ(byte_level_decode("\u20ac"), std::nullopt);
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
}

}  // namespace
}  // namespace lt
