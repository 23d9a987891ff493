// text/pretokenizer.h — the Split pre-tokenizer: a regex (PCRE2, UTF + UCP, JIT) cuts text into pieces.
//
// Semantics of HF's Split with behavior "Isolated", invert false: every match is a piece, and so is every
// stretch of text between two matches (for the Qwen and Llama 3 patterns the alternatives cover every
// character, so there are none). Empty matches produce no piece. \s, \p{L}, \p{N} follow Unicode (UCP),
// as HF's Oniguruma does: \s includes U+0085 and excludes U+FEFF (JavaScript's \s is the other way round,
// one of the few places where the JS reference encoder can differ from HF's).
#pragma once

#include <string>
#include <string_view>
#include <vector>

struct pcre2_real_code_8;

namespace lt {

class SplitRegex {
 public:
  // `source` names the file in errors (a pattern PCRE2 rejects is reported with its offset).
  SplitRegex(std::string_view pattern, const std::string& source);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;

  // Appends the pieces of `text` (valid UTF-8; not checked again) to `pieces`, in order; they cover it.
  // Safe to call from several threads at once (match data and JIT stack are per thread).
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

  bool jit() const { return jit_; }

 private:
  pcre2_real_code_8* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace lt
