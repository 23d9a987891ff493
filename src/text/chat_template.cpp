#include "text/chat_template.h"

#include <optional>

#include "core/error.h"
#include "text/utf8.h"

namespace lt {

namespace {

// Collects segments, merging a segment into the previous one when both have the same flag.
class SegmentWriter {
 public:
  void add(std::string_view text, bool trainable) {
    if (text.empty()) return;
    if (!out_.empty() && out_.back().trainable == trainable) {
      out_.back().text += text;
    } else {
      out_.push_back(ChatSegment{std::string(text), trainable});
    }
  }
  std::vector<ChatSegment> take() { return std::move(out_); }

 private:
  std::vector<ChatSegment> out_;
};

std::string_view lstrip_newlines(std::string_view s) {
  while (!s.empty() && s.front() == '\n') s.remove_prefix(1);
  return s;
}

std::string_view rstrip_newlines(std::string_view s) {
  while (!s.empty() && s.back() == '\n') s.remove_suffix(1);
  return s;
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) { return s.size() >= p.size() && s.substr(s.size() - p.size()) == p; }

// Python's str.isspace, which Jinja's `trim` (str.strip) removes: Unicode White_Space plus the
// information separators U+001C..U+001F.
bool is_python_whitespace(char32_t cp) { return is_unicode_whitespace(cp) || (cp >= 0x1C && cp <= 0x1F); }

// Jinja's `|trim` on valid UTF-8 (messages are repaired on load): leading and trailing Python whitespace.
std::string_view jinja_trim(std::string_view s) {
  auto at = [&](size_t i, int* len) {
    int bad = 0;
    *len = utf8_sequence_length(reinterpret_cast<const unsigned char*>(s.data()) + i, s.size() - i, &bad);
    return *len > 0 ? utf8_decode(reinterpret_cast<const unsigned char*>(s.data()) + i, *len) : char32_t(0);
  };
  size_t begin = 0;
  while (begin < s.size()) {
    int len = 0;
    char32_t cp = at(begin, &len);
    if (len == 0 || !is_python_whitespace(cp)) break;
    begin += size_t(len);
  }
  size_t end = s.size();  // step back over whole code points: continuation bytes are 10xxxxxx
  while (end > begin) {
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    int len = 0;
    char32_t cp = at(start, &len);
    if (len == 0 || start + size_t(len) != end || !is_python_whitespace(cp)) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

void check_roles(std::span<const ChatMessage> messages, ChatTemplateKind kind) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    LT_CHECK(r == "system" || r == "user" || r == "assistant",
             "chat template {}: message {} has role '{}' (supported: system, user, assistant)",
             chat_template_name(kind), i, r);
  }
}

// Qwen3's template: reasoning is what the content holds before the FIRST "</think>" (after the last
// "<think>" there, newlines trimmed), the answer what follows the LAST "</think>" (leading newlines
// trimmed). Content without "</think>" is all answer.
struct ThinkSplit {
  std::string_view reasoning, answer;
};

ThinkSplit split_think(std::string_view content) {
  constexpr std::string_view kClose = "</think>", kOpen = "<think>";
  size_t first_close = content.find(kClose);
  if (first_close == std::string_view::npos) return {{}, content};
  std::string_view answer = lstrip_newlines(content.substr(content.rfind(kClose) + kClose.size()));
  std::string_view before = rstrip_newlines(content.substr(0, first_close));
  size_t open = before.rfind(kOpen);
  if (open != std::string_view::npos) before = before.substr(open + kOpen.size());
  return {lstrip_newlines(before), answer};
}

void render_qwen2_5(std::span<const ChatMessage> m, GenerationPrompt prompt, SegmentWriter& w) {
  size_t first = 0;
  if (!m.empty() && m[0].role == "system") {
    w.add("<|im_start|>system\n" + m[0].content + "<|im_end|>\n", false);
    first = 1;
  } else {
    w.add("<|im_start|>system\n" + std::string(kQwen25DefaultSystem) + "<|im_end|>\n", false);
  }
  for (size_t i = first; i < m.size(); ++i) {
    w.add("<|im_start|>" + m[i].role + "\n", false);
    bool assistant = m[i].role == "assistant";
    w.add(m[i].content + "<|im_end|>", assistant);
    w.add("\n", false);
  }
  if (prompt == GenerationPrompt::yes) w.add("<|im_start|>assistant\n", false);
}

void render_qwen3(std::span<const ChatMessage> m, GenerationPrompt prompt, SegmentWriter& w) {
  // The last user message that is not a wrapped tool response; the template's ns.last_query_index.
  size_t last_query = m.empty() ? 0 : m.size() - 1;
  for (size_t i = m.size(); i-- > 0;) {
    const std::string& c = m[i].content;
    if (m[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role != "assistant") {
      w.add("<|im_start|>" + m[i].role + "\n" + m[i].content + "<|im_end|>\n", false);
      continue;
    }
    ThinkSplit t = split_think(m[i].content);
    bool last = i + 1 == m.size();
    std::string reasoning(rstrip_newlines(lstrip_newlines(t.reasoning)));
    if (i > last_query && (last || !reasoning.empty())) {
      std::string think = "<think>\n" + reasoning + "\n</think>\n\n";
      w.add("<|im_start|>assistant\n", false);
      w.add(think, !reasoning.empty());  // an empty block is the non-thinking prompt, not an output
      w.add(std::string(lstrip_newlines(t.answer)) + "<|im_end|>", true);
    } else {
      w.add("<|im_start|>assistant\n", false);
      w.add(std::string(t.answer) + "<|im_end|>", true);
    }
    w.add("\n", false);
  }
  if (prompt == GenerationPrompt::yes) w.add("<|im_start|>assistant\n<think>\n\n</think>\n\n", false);
}

// Qwen3.5's template (text content, no tools, preserve_thinking unset). Unlike Qwen3's: every content is
// trimmed (Jinja `|trim`); EVERY assistant message after the last user query gets a think block, with or
// without reasoning; a system message anywhere but first, or no user query at all, is an error (the
// template raises).
void render_qwen3_5(std::span<const ChatMessage> m, GenerationPrompt prompt, SegmentWriter& w) {
  constexpr std::string_view kName = "chat template qwen3_5";
  std::optional<size_t> last_query;  // the template's ns.last_query_index
  for (size_t i = m.size(); i-- > 0;) {
    std::string_view c = jinja_trim(m[i].content);
    if (m[i].role == "user" && !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  LT_CHECK(last_query || m.empty(), "{}: no user message (Qwen3.5's template needs one that is not a tool response)",
           kName);
  for (size_t i = 0; i < m.size(); ++i) {
    std::string_view content = jinja_trim(m[i].content);
    if (m[i].role == "system") {
      LT_CHECK(i == 0, "{}: message {} is a system message; Qwen3.5's template allows one only at the beginning",
               kName, i);
      w.add("<|im_start|>system\n" + std::string(content) + "<|im_end|>\n", false);
    } else if (m[i].role == "user") {
      w.add("<|im_start|>user\n" + std::string(content) + "<|im_end|>\n", false);
    } else {
      ThinkSplit t = split_think(content);
      std::string reasoning(jinja_trim(t.reasoning));
      w.add("<|im_start|>assistant\n", false);
      if (i > *last_query) w.add("<think>\n" + reasoning + "\n</think>\n\n", !reasoning.empty());
      w.add(std::string(t.answer) + "<|im_end|>", true);
      w.add("\n", false);
    }
  }
  // Non-thinking form (enable_thinking=false), the form the trained answers take.
  if (prompt == GenerationPrompt::yes) w.add("<|im_start|>assistant\n<think>\n\n</think>\n\n", false);
}

void render_plain(std::span<const ChatMessage> m, const std::string& eos, SegmentWriter& w) {
  for (size_t i = 0; i < m.size(); ++i) {
    if (m[i].role == "system") {
      w.add(m[i].content + "\n\n", false);
    } else if (m[i].role == "user") {
      w.add(m[i].content + "\n", false);
    } else {
      LT_CHECK(!eos.empty(),
               "chat template plain: an assistant turn ends with the EOS token, and none is known (give the "
               "tokenizer a tokenizer_config.json with eos_token)");
      w.add(m[i].content + eos, true);
    }
  }
}

}  // namespace

ChatTemplateKind parse_chat_template_kind(std::string_view name) {
  if (name == "qwen2_5") return ChatTemplateKind::qwen2_5;
  if (name == "qwen3") return ChatTemplateKind::qwen3;
  if (name == "qwen3_5") return ChatTemplateKind::qwen3_5;
  if (name == "plain") return ChatTemplateKind::plain;
  LT_FAIL("unknown chat template '{}' (supported: qwen2_5, qwen3, qwen3_5, plain)", name);
}

std::string_view chat_template_name(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::qwen2_5: return "qwen2_5";
    case ChatTemplateKind::qwen3: return "qwen3";
    case ChatTemplateKind::qwen3_5: return "qwen3_5";
    case ChatTemplateKind::plain: return "plain";
  }
  return "?";
}

ChatTemplateKind default_chat_template(std::string_view model_type) {
  if (model_type == "qwen2") return ChatTemplateKind::qwen2_5;
  if (model_type == "qwen3") return ChatTemplateKind::qwen3;
  if (model_type == "qwen3_5") return ChatTemplateKind::qwen3_5;
  return ChatTemplateKind::plain;
}

ChatTemplate::ChatTemplate(ChatTemplateKind kind, std::string eos_token) : kind_(kind), eos_token_(std::move(eos_token)) {}

ChatTemplate::ChatTemplate(ChatTemplateKind kind, const Tokenizer& tokenizer) : kind_(kind) {
  if (tokenizer.special_ids().eos) eos_token_ = tokenizer.token_bytes(*tokenizer.special_ids().eos);
}

std::vector<ChatSegment> ChatTemplate::render_segments(std::span<const ChatMessage> messages,
                                                       GenerationPrompt prompt) const {
  check_roles(messages, kind_);
  SegmentWriter w;
  switch (kind_) {
    case ChatTemplateKind::qwen2_5: render_qwen2_5(messages, prompt, w); break;
    case ChatTemplateKind::qwen3: render_qwen3(messages, prompt, w); break;
    case ChatTemplateKind::qwen3_5: render_qwen3_5(messages, prompt, w); break;
    case ChatTemplateKind::plain: render_plain(messages, eos_token_, w); break;
  }
  return w.take();
}

std::string ChatTemplate::render(std::span<const ChatMessage> messages, GenerationPrompt prompt) const {
  std::string out;
  for (const ChatSegment& s : render_segments(messages, prompt)) out += s.text;
  return out;
}

TokenizedChat tokenize_chat(const Tokenizer& tokenizer, std::span<const ChatSegment> segments) {
  TokenizedChat t;
  for (const ChatSegment& s : segments) {
    tokenizer.encode_append(s.text, t.ids, /*allow_special=*/true);
    t.trainable.resize(t.ids.size(), s.trainable ? 1 : 0);
  }
  return t;
}

}  // namespace lt
