#include "text/utf8.h"

#include <utf8proc.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace lt {

int utf8_sequence_length(const unsigned char* p, size_t n, int* bad) {
  const unsigned c = p[0];
  if (c < 0x80) return 1;
  // Table 3-7 of the Unicode standard: the allowed range of the second byte depends on the first.
  int trail = 0;
  unsigned lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    trail = 1;
  } else if (c == 0xE0) {
    trail = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    trail = 2;
  } else if (c == 0xED) {
    trail = 2, hi = 0x9F;  // no surrogates
  } else if (c == 0xF0) {
    trail = 3, lo = 0x90;  // no overlong 4-byte forms
  } else if (c >= 0xF1 && c <= 0xF3) {
    trail = 3;
  } else if (c == 0xF4) {
    trail = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    *bad = 1;  // 80..BF, C0, C1, F5..FF never start a sequence
    return 0;
  }
  for (int i = 1; i <= trail; ++i) {
    if (size_t(i) >= n) {
      *bad = i;
      return 0;
    }
    const unsigned b = p[i];
    if (b < (i == 1 ? lo : 0x80u) || b > (i == 1 ? hi : 0xBFu)) {
      *bad = i;
      return 0;
    }
  }
  return trail + 1;
}

bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    // ASCII runs, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int bad = 0;
    int len = utf8_sequence_length(p + i, n - i, &bad);
    if (len == 0) return false;
    i += size_t(len);
  }
  return true;
}

std::string utf8_repair(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    int bad = 0;
    int len = utf8_sequence_length(p + i, n - i, &bad);
    if (len > 0) {
      out.append(s.data() + i, size_t(len));
      i += size_t(len);
    } else {
      out.append("\xEF\xBF\xBD");
      i += size_t(bad);
    }
  }
  return out;
}

char32_t utf8_decode(const unsigned char* p, int length) {
  switch (length) {
    case 1: return p[0];
    case 2: return char32_t(p[0] & 0x1F) << 6 | (p[1] & 0x3F);
    case 3: return char32_t(p[0] & 0x0F) << 12 | char32_t(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
    default:
      return char32_t(p[0] & 0x07) << 18 | char32_t(p[1] & 0x3F) << 12 | char32_t(p[2] & 0x3F) << 6 |
             (p[3] & 0x3F);
  }
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

bool is_unicode_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::string_view nfc(std::string_view s, std::string& storage) {
  bool maybe_not_nfc = false;
  for (unsigned char c : s) {
    if (c >= 0xCC) {
      maybe_not_nfc = true;
      break;
    }
  }
  if (!maybe_not_nfc) return s;
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    std::free(out);
    LT_FAIL("NFC normalisation failed: {} (the text was repaired to valid UTF-8 before, so this is a bug)",
            utf8proc_errmsg(n));
  }
  storage.assign(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return storage;
}

std::string nfc(std::string_view s) {
  std::string storage;
  std::string_view v = nfc(s, storage);
  if (v.data() == s.data()) return std::string(s);
  return storage;
}

}  // namespace lt
