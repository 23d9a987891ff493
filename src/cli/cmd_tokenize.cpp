// cli/cmd_tokenize.cpp — `lazytrain tokenize`: a text's token ids (and pieces) under a tokenizer.json.
//
//   lazytrain tokenize --tokenizer DIR|tokenizer.json (--text S | --text-file F) [--json] [--no-special]
// Prints the ids as a list, then one line per token: id and the bytes it stands for, quoted, with
// control characters escaped and bytes that are part of a UTF-8 sequence split across tokens as \xNN.
// With --json: {"ids": [...]} on one line, nothing else.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/json_file.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace lt::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer, text, text_file;  // exactly one of text / text_file was given
  bool json = false, no_special = false;
};

// A token's bytes for a terminal: printable UTF-8 as is, controls escaped, stray bytes as \xNN.
std::string quote_piece(std::string_view bytes) {
  std::string out = "\"";
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    int bad = 0;
    int len = utf8_sequence_length(p + i, bytes.size() - i, &bad);
    if (len == 0) {
      for (int k = 0; k < bad; ++k) out += fmt::format("\\x{:02x}", p[i + size_t(k)]);
      i += size_t(bad);
      continue;
    }
    char32_t cp = utf8_decode(p + i, len);
    if (cp == '\n') out += "\\n";
    else if (cp == '\t') out += "\\t";
    else if (cp == '\r') out += "\\r";
    else if (cp == '"') out += "\\\"";
    else if (cp == '\\') out += "\\\\";
    else if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp < 0xA0)) out += fmt::format("\\u{:04x}", uint32_t(cp));
    else out.append(bytes.data() + i, size_t(len));
    i += size_t(len);
  }
  return out + "\"";
}

void run_tokenize(const TokenizeOptions& o) {
  Tokenizer tok = Tokenizer::load(o.tokenizer);
  std::string text = o.text_file.empty() ? o.text : read_file(o.text_file);
  std::vector<int32_t> ids = tok.encode(text, /*allow_special=*/!o.no_special);
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"ids", ids}}.dump().c_str());
    return;
  }
  std::printf("ids: [%s]\n", fmt::format("{}", fmt::join(ids, ", ")).c_str());
  for (int32_t id : ids) {
    std::printf("%9d  %s%s\n", id, quote_piece(tok.token_bytes(id)).c_str(), tok.is_special(id) ? "  (special)" : "");
  }
  std::printf("%zu tokens, %zu bytes\n", ids.size(), text.size());
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = app.add_subcommand("tokenize", "print the token ids (and pieces) of a text");
  cmd->add_option("--tokenizer", o->tokenizer, "tokenizer.json, or the directory holding it")->required();
  auto* text = cmd->add_option("--text", o->text, "the text to tokenize");
  auto* file = cmd->add_option("--text-file", o->text_file, "a file whose bytes are the text");
  text->excludes(file);
  cmd->add_flag("--json", o->json, "print {\"ids\": [...]} only");
  cmd->add_flag("--no-special", o->no_special, "encode special tokens (<|im_end|>, ...) as plain text");
  cmd->callback([o, text, file]() {
    LT_CHECK(text->count() + file->count() == 1, "tokenize: give one of --text and --text-file");
    run_tokenize(*o);
  });
}

}  // namespace lt::cli
