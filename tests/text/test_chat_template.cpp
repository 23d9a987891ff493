// Tests for text/chat_template.h: golden strings written out by hand from the Qwen2.5 and Qwen3
// tokenizer_config.json templates and Qwen3.5's chat_template.jinja (no tools), the plain template, the trainable flags, and, with the
// real Qwen3 tokenizer, that tokenising segment by segment equals tokenising the whole rendering.
#include <gtest/gtest.h>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/utf8.h"
#include "text_testing.h"

namespace lt {
namespace {

using Msgs = std::vector<ChatMessage>;

const std::string kDefaultSystem =
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";

std::string render(ChatTemplateKind k, const Msgs& m, GenerationPrompt p = GenerationPrompt::no) {
  return ChatTemplate(k, "<|endoftext|>").render(m, p);
}

std::vector<ChatSegment> segments(ChatTemplateKind k, const Msgs& m, GenerationPrompt p = GenerationPrompt::no) {
  return ChatTemplate(k, "<|endoftext|>").render_segments(m, p);
}

TEST(ChatTemplate, Names) {
  EXPECT_EQ(parse_chat_template_kind("qwen2_5"), ChatTemplateKind::qwen2_5);
  EXPECT_EQ(parse_chat_template_kind("qwen3"), ChatTemplateKind::qwen3);
  EXPECT_EQ(parse_chat_template_kind("qwen3_5"), ChatTemplateKind::qwen3_5);
  EXPECT_EQ(parse_chat_template_kind("plain"), ChatTemplateKind::plain);
  for (auto k : {ChatTemplateKind::qwen2_5, ChatTemplateKind::qwen3, ChatTemplateKind::qwen3_5, ChatTemplateKind::plain})
    EXPECT_EQ(parse_chat_template_kind(chat_template_name(k)), k);
  try {
    parse_chat_template_kind("chatml");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen2_5, qwen3, qwen3_5, plain"), std::string::npos) << e.what();
  }
  EXPECT_EQ(default_chat_template("qwen2"), ChatTemplateKind::qwen2_5);
  EXPECT_EQ(default_chat_template("qwen3"), ChatTemplateKind::qwen3);
  EXPECT_EQ(default_chat_template("qwen3_5"), ChatTemplateKind::qwen3_5);
  EXPECT_EQ(default_chat_template("llama"), ChatTemplateKind::plain);
}

TEST(ChatTemplate, Qwen25DefaultSystemPrompt) {
  Msgs m = {{"user", "Hello"}};
  EXPECT_EQ(render(ChatTemplateKind::qwen2_5, m), kDefaultSystem + "<|im_start|>user\nHello<|im_end|>\n");
  EXPECT_EQ(render(ChatTemplateKind::qwen2_5, m, GenerationPrompt::yes),
            kDefaultSystem + "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(render(ChatTemplateKind::qwen2_5, {}), kDefaultSystem);
}

TEST(ChatTemplate, Qwen25Conversation) {
  Msgs m = {{"system", "Be brief."}, {"user", "2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}, {"assistant", "6"}};
  EXPECT_EQ(render(ChatTemplateKind::qwen2_5, m),
            "<|im_start|>system\nBe brief.<|im_end|>\n"
            "<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n"
            "<|im_start|>user\nAnd 3+3?<|im_end|>\n"
            "<|im_start|>assistant\n6<|im_end|>\n");
  std::vector<ChatSegment> expected = {
      {"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", false},
      {"4<|im_end|>", true},
      {"\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n", false},
      {"6<|im_end|>", true},
      {"\n", false},
  };
  EXPECT_EQ(segments(ChatTemplateKind::qwen2_5, m), expected);
  // A system message that is not first is a turn like any other; the default prompt comes first.
  EXPECT_EQ(render(ChatTemplateKind::qwen2_5, {{"user", "u"}, {"system", "s"}, {"assistant", "a"}}),
            kDefaultSystem +
                "<|im_start|>user\nu<|im_end|>\n<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3NonThinkingGenerationPrompt) {
  EXPECT_EQ(render(ChatTemplateKind::qwen3, {{"user", "Hi"}}, GenerationPrompt::yes),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  // No default system prompt.
  EXPECT_EQ(render(ChatTemplateKind::qwen3, {{"system", "S"}, {"user", "Hi"}}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, Qwen3LastAnswerGetsTheEmptyThinkBlockAndIsTrainedWithoutIt) {
  Msgs m = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}};
  EXPECT_EQ(render(ChatTemplateKind::qwen3, m),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
  std::vector<ChatSegment> expected = {
      {"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
       false},
      {"A<|im_end|>", true},
      {"\n", false},
  };
  EXPECT_EQ(segments(ChatTemplateKind::qwen3, m), expected);
}

TEST(ChatTemplate, Qwen3EarlierAnswersLoseTheirReasoning) {
  Msgs m = {{"user", "U1"},
            {"assistant", "<think>\nplan one\n</think>\n\nA1"},
            {"user", "U2"},
            {"assistant", "<think>\nplan two\n</think>\n\nA2"}};
  EXPECT_EQ(render(ChatTemplateKind::qwen3, m),
            "<|im_start|>user\nU1<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nplan two\n</think>\n\nA2<|im_end|>\n");
  std::vector<ChatSegment> expected = {
      {"<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n", false},
      {"A1<|im_end|>", true},
      {"\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n", false},
      {"<think>\nplan two\n</think>\n\nA2<|im_end|>", true},  // written reasoning is an output
      {"\n", false},
  };
  EXPECT_EQ(segments(ChatTemplateKind::qwen3, m), expected);
  // Multi-turn without reasoning: only the last answer has the (empty) block.
  EXPECT_EQ(render(ChatTemplateKind::qwen3, {{"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}}, GenerationPrompt::yes),
            "<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen3SplitsReasoningAsTheTemplateDoes) {
  // Newlines around the reasoning and before the answer are trimmed; text before <think> is dropped.
  EXPECT_EQ(render(ChatTemplateKind::qwen3, {{"user", "U"}, {"assistant", "x<think>\n\nr\n\n</think>\n\n\nA"}}),
            "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\nr\n</think>\n\nA<|im_end|>\n");
  // Two assistant messages after the last query: the first without reasoning has no block.
  EXPECT_EQ(render(ChatTemplateKind::qwen3, {{"user", "U"}, {"assistant", "A"}, {"assistant", "B"}}),
            "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n");
  // A wrapped tool response is not a query: the answers after the real question count as after it.
  EXPECT_EQ(render(ChatTemplateKind::qwen3, {{"user", "Q"},
                                             {"assistant", "A"},
                                             {"user", "<tool_response>\nr\n</tool_response>"},
                                             {"assistant", "B"}}),
            "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nA<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n");
}

TEST(ChatTemplate, Qwen35LastAnswerGetsTheEmptyThinkBlockAndIsTrainedWithoutIt) {
  Msgs m = {{"system", "S"}, {"user", "U"}, {"assistant", "A"}};
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, m),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
  std::vector<ChatSegment> expected = {
      {"<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
       false},
      {"A<|im_end|>", true},
      {"\n", false},
  };
  EXPECT_EQ(segments(ChatTemplateKind::qwen3_5, m), expected);
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, {{"user", "Hi"}}, GenerationPrompt::yes),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

TEST(ChatTemplate, Qwen35GivesEveryAnswerAfterTheLastQueryAThinkBlock) {
  // Where Qwen3's template renders A without a block (it is neither last nor has reasoning).
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, {{"user", "U"}, {"assistant", "A"}, {"assistant", "B"}}),
            "<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n");
  // Earlier answers lose their reasoning; written reasoning after the last query is trained.
  Msgs m = {{"user", "U1"},
            {"assistant", "<think>\nplan one\n</think>\n\nA1"},
            {"user", "U2"},
            {"assistant", "<think>\nplan two\n</think>\n\nA2"}};
  std::vector<ChatSegment> expected = {
      {"<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\n", false},
      {"A1<|im_end|>", true},
      {"\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n", false},
      {"<think>\nplan two\n</think>\n\nA2<|im_end|>", true},
      {"\n", false},
  };
  EXPECT_EQ(segments(ChatTemplateKind::qwen3_5, m), expected);
  // A wrapped tool response (after trimming) is not a query.
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5,
                   {{"user", "Q"}, {"assistant", "A"}, {"user", " <tool_response>\nr\n</tool_response>\n"}, {"assistant", "B"}}),
            "<|im_start|>user\nQ<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nB<|im_end|>\n");
}

TEST(ChatTemplate, Qwen35TrimsEveryContentAsJinjaTrimDoes) {
  // |trim is Python's str.strip: ASCII whitespace, U+001C..U+001F, NBSP, ideographic space, ...
  // The reasoning is split out of the trimmed content (newlines stripped as in Qwen3) and trimmed again;
  // the answer keeps its leading space, as only newlines are stripped after "</think>".
  Msgs m = {{"system", " S \n"},
            {"user", "\n\t U\u3000\u00a0\x1c"},
            {"assistant", "  <think>\n r \n</think>\n\n A \n"}};
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, m),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr\n</think>\n\n A<|im_end|>\n");
  // Inner whitespace and non-whitespace look-alikes (U+200B is not Python whitespace) stay.
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, {{"user", "\u200ba b\u2003"}}),
            "<|im_start|>user\n\u200ba b<|im_end|>\n");
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, {{"user", " \n "}, {"assistant", "\n"}}),
            "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<|im_end|>\n");
}

TEST(ChatTemplate, Qwen35RaisesWhereTheTemplateDoes) {
  auto message_of = [](const Msgs& m) {
    try {
      render(ChatTemplateKind::qwen3_5, m);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message_of({{"user", "U"}, {"system", "S"}, {"assistant", "A"}}).find("message 1 is a system message"),
            std::string::npos);
  EXPECT_NE(message_of({{"system", "S"}, {"assistant", "A"}}).find("no user message"), std::string::npos);
  EXPECT_NE(message_of({{"user", "<tool_response>r</tool_response>"}}).find("no user message"), std::string::npos);
  EXPECT_EQ(render(ChatTemplateKind::qwen3_5, {}), "");
}

TEST(ChatTemplate, Plain) {
  Msgs m = {{"system", "S"}, {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "3+3?"}, {"assistant", "6"}};
  EXPECT_EQ(render(ChatTemplateKind::plain, m), "S\n\nWhat is 2+2?\n4<|endoftext|>3+3?\n6<|endoftext|>");
  std::vector<ChatSegment> expected = {
      {"S\n\nWhat is 2+2?\n", false}, {"4<|endoftext|>", true}, {"3+3?\n", false}, {"6<|endoftext|>", true}};
  EXPECT_EQ(segments(ChatTemplateKind::plain, m), expected);
  EXPECT_EQ(render(ChatTemplateKind::plain, {{"user", "Q"}}, GenerationPrompt::yes), "Q\n");
  EXPECT_THROW(ChatTemplate(ChatTemplateKind::plain).render(Msgs{{"user", "Q"}, {"assistant", "A"}}), Error);
}

TEST(ChatTemplate, RefusesUnknownRoles) {
  for (auto k : {ChatTemplateKind::qwen2_5, ChatTemplateKind::qwen3, ChatTemplateKind::qwen3_5, ChatTemplateKind::plain}) {
    try {
      render(k, {{"user", "u"}, {"tool", "t"}});
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("role 'tool'"), std::string::npos) << e.what();
    }
  }
}

// Conversations whose segment boundaries are all safe (see chat_template.h).
std::vector<Msgs> safe_conversations() {
  return {
      {{"user", "Hello"}, {"assistant", "Hi! How can I help?"}},
      {{"system", "你是一个助手。"}, {"user", "把 x = 42 翻译成 C++"}, {"assistant", "```cpp\nint x = 42;\n```"}},
      {{"user", "emoji?"}, {"assistant", "👨‍👩‍👧 yes 🎉"}, {"user", "numbers"}, {"assistant", "  12345.678 leading spaces"}},
      {{"user", "tabs"}, {"assistant", "\tindented\n\tcode\n"}, {"user", "q"}, {"assistant", "<think>\nhmm\n</think>\n\nok"}},
      {{"user", "answer ends in newlines"}, {"assistant", "done.\n\n"}},
      {{"user", "Résumé e\u0301"}, {"assistant", "e\u0301 NFC at the start"}},
  };
}

TEST(ChatTemplate, SegmentwiseTokenisationEqualsWholeWithQwen3Tokenizer) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = testing::qwen3_tokenizer();
  for (auto k : {ChatTemplateKind::qwen2_5, ChatTemplateKind::qwen3, ChatTemplateKind::qwen3_5, ChatTemplateKind::plain}) {
    ChatTemplate tpl(k, tok);  // plain takes the tokenizer's EOS: <|im_end|> for this config
    for (const Msgs& m : safe_conversations()) {
      for (auto p : {GenerationPrompt::no, GenerationPrompt::yes}) {
        if (p == GenerationPrompt::yes && m.back().role == "assistant") continue;
        std::vector<ChatSegment> segs = tpl.render_segments(m, p);
        TokenizedChat t = tokenize_chat(tok, segs);
        EXPECT_EQ(t.ids, tok.encode(tpl.render(m, p))) << chat_template_name(k) << ": " << tpl.render(m, p);
        ASSERT_EQ(t.trainable.size(), t.ids.size());
        // The trainable tokens decode to the trainable text; each ends with the turn's closing token.
        std::string trained, expected;
        std::vector<int32_t> run;
        for (size_t i = 0; i < t.ids.size(); ++i) {
          if (t.trainable[i]) run.push_back(t.ids[i]);
          if (t.trainable[i] && (i + 1 == t.ids.size() || !t.trainable[i + 1])) {
            EXPECT_EQ(run.back(), *tok.special_ids().im_end) << chat_template_name(k);
            trained += tok.decode(run);
            run.clear();
          }
        }
        for (const ChatSegment& s : segs)
          if (s.trainable) expected += s.text;
        EXPECT_EQ(trained, nfc(expected)) << chat_template_name(k);
      }
    }
  }
}

TEST(ChatTemplate, TheDocumentedExceptionToSegmentwiseEquality) {
  LT_REQUIRE_QWEN3();
  const Tokenizer& tok = testing::qwen3_tokenizer();
  ChatTemplate tpl(ChatTemplateKind::qwen2_5, tok);
  // An answer starting with whitespace that runs into a line break: whole, "\n \n" is one piece with
  // the header's "\n"; segment-wise the header's "\n" stands alone (as at inference).
  Msgs m = {{"user", "u"}, {"assistant", " \nanswer"}};
  std::vector<int32_t> whole = tok.encode(tpl.render(m));
  std::vector<int32_t> segmentwise = tokenize_chat(tok, tpl.render_segments(m)).ids;
  EXPECT_NE(whole, segmentwise);
  EXPECT_EQ(tok.decode(whole), tok.decode(segmentwise));
}

}  // namespace
}  // namespace lt
