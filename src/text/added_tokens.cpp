#include "text/added_tokens.h"

#include <map>

#include "text/utf8.h"

namespace lt {

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens) {
  for (const AddedToken& t : tokens) {
    if (!t.content.empty()) tokens_.push_back(t);
  }
  // Build a trie with ordered children, then lay it out breadth-first with contiguous edges.
  struct BuildNode {
    int32_t token = -1;
    std::map<uint8_t, int32_t> children;
  };
  std::vector<BuildNode> build(1);
  for (size_t k = 0; k < tokens_.size(); ++k) {
    int32_t node = 0;
    for (unsigned char b : tokens_[k].content) {
      auto it = build[size_t(node)].children.find(b);
      if (it == build[size_t(node)].children.end()) {
        build.push_back({});
        it = build[size_t(node)].children.emplace(b, int32_t(build.size() - 1)).first;
      }
      node = it->second;
    }
    build[size_t(node)].token = int32_t(k);  // a duplicate content: the later entry wins
    first_byte_[uint8_t(tokens_[k].content[0])] = true;
  }
  nodes_.resize(build.size());
  for (size_t i = 0; i < build.size(); ++i) {
    nodes_[i].token = build[i].token;
    nodes_[i].first_edge = uint32_t(edges_.size());
    nodes_[i].num_edges = uint32_t(build[i].children.size());
    for (auto [b, n] : build[i].children) edges_.push_back(Edge{b, n});
  }
}

int32_t AddedTokenMatcher::child(int32_t node, uint8_t b) const {
  const Node& n = nodes_[size_t(node)];
  for (uint32_t e = n.first_edge; e < n.first_edge + n.num_edges; ++e) {
    if (edges_[e].byte == b) return edges_[e].node;
  }
  return -1;
}

std::optional<AddedTokenMatch> AddedTokenMatcher::find(std::string_view text, size_t from, bool allow_special) const {
  if (tokens_.empty()) return std::nullopt;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = from; i < n; ++i) {
    if (!first_byte_[p[i]]) continue;
    int32_t best = -1;
    size_t best_end = 0;
    int32_t node = 0;
    for (size_t j = i; j < n; ++j) {
      node = child(node, p[j]);
      if (node < 0) break;
      int32_t k = nodes_[size_t(node)].token;
      if (k >= 0 && (allow_special || !tokens_[size_t(k)].special)) best = k, best_end = j + 1;
    }
    if (best < 0) continue;
    const AddedToken& t = tokens_[size_t(best)];
    AddedTokenMatch m{i, best_end, t.id};
    if (t.lstrip) {
      while (m.begin > from) {
        size_t s = m.begin - 1;
        while (s > from && (p[s] & 0xC0) == 0x80) --s;  // back to the lead byte
        int bad = 0;
        int len = utf8_sequence_length(p + s, n - s, &bad);
        if (len <= 0 || !is_unicode_whitespace(utf8_decode(p + s, len))) break;
        m.begin = s;
      }
    }
    if (t.rstrip) {
      while (m.end < n) {
        int bad = 0;
        int len = utf8_sequence_length(p + m.end, n - m.end, &bad);
        if (len <= 0 || !is_unicode_whitespace(utf8_decode(p + m.end, len))) break;
        m.end += size_t(len);
      }
    }
    return m;
  }
  return std::nullopt;
}

}  // namespace lt
