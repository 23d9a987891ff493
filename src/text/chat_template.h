// text/chat_template.h — chat templates: messages -> text, and -> segments marked trainable or not.
//
// Templates (config key `template`, default from the model's config.json model_type):
//   qwen2_5  ChatML as Qwen2.5's tokenizer_config.json renders it without tools:
//              <|im_start|>system\n{system}<|im_end|>\n        (when messages[0] is not a system
//              message, the default "You are Qwen, created by Alibaba Cloud. You are a helpful
//              assistant." is used)
//              <|im_start|>{role}\n{content}<|im_end|>\n      for every other message
//            generation prompt: <|im_start|>assistant\n
//   qwen3    ChatML as Qwen3's template renders it, non-thinking form. No default system prompt. An
//            assistant message after the last user query is rendered with a think block,
//              <|im_start|>assistant\n<think>\n{reasoning}\n</think>\n\n{content}<|im_end|>\n
//            when it is the last message or has reasoning (an empty block, "<think>\n\n</think>\n\n",
//            when there is none); every earlier assistant message is rendered WITHOUT one, its
//            reasoning dropped: <|im_start|>assistant\n{content}<|im_end|>\n. Reasoning is what a message's
//            content holds before "</think>" (after "<think>"), as the template splits it.
//            generation prompt (enable_thinking=false): <|im_start|>assistant\n<think>\n\n</think>\n\n
//   qwen3_5  ChatML as Qwen3.5's (and Qwen3.6's) template renders text content without tools, non-thinking
//            form. Differs from qwen3 in three ways: every content is trimmed of surrounding whitespace
//            (Jinja `|trim`: Python's str.strip); EVERY assistant message after the last user query is
//            rendered with a think block (empty when it has no reasoning), not only the last one; and a
//            system message that is not first, or a conversation without a user query, is an error (the
//            template raises). Earlier assistant messages lose their reasoning, as in qwen3.
//            generation prompt (enable_thinking=false): <|im_start|>assistant\n<think>\n\n</think>\n\n
//   plain    for models without a template: {system}\n\n, then per turn {user}\n and {assistant}{eos}.
//
// Trainable segments (labels for the loss): an assistant message's content and the token that closes
// it (<|im_end|>, or EOS for plain) — and a non-empty think block, which the model must learn to write.
// Everything else is not: role headers, the "\n" after <|im_end|>, system and user turns, and the EMPTY
// think block of qwen3 and qwen3_5, which at inference is part of the non-thinking generation prompt the
// model is given (as LLaMA-Factory does for enable_thinking=false). Adjacent segments with the same flag are
// merged. Roles other than system, user and assistant (tools) are refused.
//
// Tokenising segment by segment (tokenize_chat) equals tokenising render() whole when no pre-tokenizer
// piece would span a segment boundary. Boundaries next to an added token (<|im_end|>, </think>) are
// always safe: added tokens are cut out before anything else. The other kind of boundary here follows
// a "\n" (end of a role header or of a plain prompt); it is safe unless the next segment starts with
// whitespace running into a line break (matches ^\s*[\r\n]), because the regex's \s*[\r\n]+ would join
// the two. Segment-wise is the right one for training in that case anyway: at inference the prompt is
// encoded up to its "\n" and the model's first token starts after it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "text/tokenizer.h"

namespace lt {

enum class ChatTemplateKind { qwen2_5, qwen3, qwen3_5, plain };

// "qwen2_5" | "qwen3" | "qwen3_5" | "plain"; throws lt::Error listing them otherwise.
ChatTemplateKind parse_chat_template_kind(std::string_view name);
std::string_view chat_template_name(ChatTemplateKind kind);
// The template a config.json model_type implies: qwen2 -> qwen2_5, qwen3 -> qwen3, qwen3_5 (either form) ->
// qwen3_5, anything else -> plain.
ChatTemplateKind default_chat_template(std::string_view model_type);

inline constexpr std::string_view kQwen25DefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatSegment {
  std::string text;
  bool trainable = false;
  bool operator==(const ChatSegment&) const = default;
};

enum class GenerationPrompt { no, yes };

class ChatTemplate {
 public:
  // eos_token: the text `plain` appends to each assistant turn; ChatML templates do not use it.
  explicit ChatTemplate(ChatTemplateKind kind, std::string eos_token = {});
  // The tokenizer's EOS (tokenizer_config.json eos_token) as eos_token, when it has one.
  ChatTemplate(ChatTemplateKind kind, const Tokenizer& tokenizer);

  ChatTemplateKind kind() const { return kind_; }
  // Throws lt::Error on an unknown role, or on an assistant turn for `plain` without an EOS token.
  std::vector<ChatSegment> render_segments(std::span<const ChatMessage> messages,
                                           GenerationPrompt prompt = GenerationPrompt::no) const;
  // The segments' texts concatenated.
  std::string render(std::span<const ChatMessage> messages, GenerationPrompt prompt = GenerationPrompt::no) const;

 private:
  ChatTemplateKind kind_;
  std::string eos_token_;
};

// Ids of the segments encoded one by one (special tokens allowed, as HF tokenises a rendered chat),
// with a trainable flag per token (1: the loss sees it; a dataset turns 0 into label -100).
struct TokenizedChat {
  std::vector<int32_t> ids;        // [T]
  std::vector<uint8_t> trainable;  // [T]
};
TokenizedChat tokenize_chat(const Tokenizer& tokenizer, std::span<const ChatSegment> segments);

}  // namespace lt
