#include "text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "text/utf8.h"

namespace lt {

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  int n = pcre2_get_error_message(code, buf, sizeof(buf));
  return n < 0 ? "unknown PCRE2 error " + std::to_string(code) : std::string(reinterpret_cast<char*>(buf), size_t(n));
}

// Per-thread match state: the match data, and a JIT stack that can grow to 8 MiB, so that long runs of
// one character class (a megabyte of spaces) cannot exhaust the 32 KiB default.
struct MatchScratch {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchScratch() {
    data = pcre2_match_data_create(32, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 << 10, 8 << 20, nullptr);
    LT_CHECK(data && context && stack, "out of memory creating PCRE2 match data");
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchScratch& scratch() {
  thread_local MatchScratch s;
  return s;
}

}  // namespace

SplitRegex::SplitRegex(std::string_view pattern, const std::string& source) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                        &offset, nullptr);
  LT_CHECK(code_ != nullptr, "{}: the pre-tokenizer regex does not compile at offset {}: {} (pattern: {})", source,
           offset, pcre2_message(err), pattern);
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;  // without JIT support: the interpreter
}

SplitRegex::~SplitRegex() { pcre2_code_free(code_); }

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  MatchScratch& s = scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t gap_begin = 0;  // start of text not yet emitted
  size_t pos = 0;        // where the next search starts
  while (pos < n) {
    int rc = jit_ ? pcre2_jit_match(code_, subject, n, pos, 0, s.data, s.context)
                  : pcre2_match(code_, subject, n, pos, PCRE2_NO_UTF_CHECK, s.data, s.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    LT_CHECK(rc >= 0, "pre-tokenizer regex failed at byte {}: {}", pos, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    size_t begin = ov[0], end = ov[1];
    if (end == begin) {  // an empty match: no piece; step over one code point
      int bad = 0;
      int len = utf8_sequence_length(subject + begin, n - begin, &bad);
      pos = begin + size_t(len > 0 ? len : 1);
      continue;
    }
    if (begin > gap_begin) pieces.push_back(text.substr(gap_begin, begin - gap_begin));
    pieces.push_back(text.substr(begin, end - begin));
    gap_begin = pos = end;
  }
  if (gap_begin < n) pieces.push_back(text.substr(gap_begin));
}

}  // namespace lt
