// text/added_tokens.h — finding a tokenizer's added tokens (<|im_start|>, <think>, ...) in text.
//
// HF semantics: added tokens are cut out of the text BEFORE normalisation and pre-tokenisation, so no
// merge or regex can split or join them. Matching is leftmost-longest over all tokens (as HF's
// Aho-Corasick and the JS DictionarySplitter). lstrip / rstrip make a match swallow the whitespace
// (Unicode White_Space) on its left / right, which is then not encoded. Tokens with normalized=false are
// matched on the raw text, those with normalized=true on the normalised text between the former; the
// Tokenizer keeps one matcher for each.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lt {

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;      // control token: matched only when encode allows special tokens
  bool lstrip = false;       // swallows whitespace on its left
  bool rstrip = false;       // swallows whitespace on its right
  bool normalized = false;   // matched on the normalised text instead of the raw text
};

struct AddedTokenMatch {
  size_t begin = 0, end = 0;  // the bytes the match replaces, stripped whitespace included
  int32_t id = 0;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  bool empty() const { return tokens_.empty(); }
  // The leftmost-longest match starting at or after `from`, skipping special tokens unless
  // allow_special; lstrip never extends it below `from`. `text` is valid UTF-8.
  std::optional<AddedTokenMatch> find(std::string_view text, size_t from, bool allow_special) const;

 private:
  struct Node {
    int32_t token = -1;  // index into tokens_ of the token ending here
    uint32_t first_edge = 0, num_edges = 0;
  };
  struct Edge {
    uint8_t byte;
    int32_t node;
  };
  int32_t child(int32_t node, uint8_t b) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> nodes_;
  std::vector<Edge> edges_;
  bool first_byte_[256] = {};
};

}  // namespace lt
