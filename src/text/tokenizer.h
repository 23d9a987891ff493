// text/tokenizer.h — byte-level BPE tokenizers read from a HF tokenizer.json (Qwen2, Qwen2.5, Qwen3,
// Llama 3, GPT-2 style), encode and decode.
//
// encode(text), in HF's order:
//   1. Invalid UTF-8 is repaired: each maximal ill-formed subsequence becomes U+FFFD (text/utf8.h).
//      HF's Rust encoder only accepts valid strings, so this equals decoding the bytes with
//      errors="replace" first, which is what Python and node do when they read such a file.
//   2. Added tokens are cut out of the raw text, leftmost-longest, honouring lstrip / rstrip
//      (text/added_tokens.h). Special ones only when allow_special; otherwise they are plain text (HF's
//      split_special_tokens=True), so user content that contains "<|im_end|>" cannot forge a turn end.
//      Non-special added tokens (<think>, <tool_call>) are always matched, as in HF.
//   3. Each stretch between added tokens is normalised (NFC when the file says so), then searched
//      for added tokens with normalized=true.
//   4. The Split pre-tokenizer regex cuts it into pieces (text/pretokenizer.h).
//   5. Each piece's bytes become ids through the BPE merges (text/bpe.h).
// No BOS/EOS is ever added (the post_processor is not applied): templates and datasets add them.
// decode(ids) concatenates the tokens' bytes (an added token gives its content) and repairs invalid
// UTF-8 the same way, so decode(encode(x)) == NFC(repair(x)) for tokenizers without lstrip/rstrip tokens.
//
// What a file may contain is checked at load: anything else (another model type, byte fallback,
// prefix space, a normaliser other than NFC, single_word tokens, ...) is refused naming the file and
// key, never approximated.
//
// Thread safety: a Tokenizer is immutable after load except for its BPE cache, which is internally
// locked; every const method may be called from several threads at once. Copies share one state.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lt {

struct SpecialTokenIds {
  // From tokenizer_config.json ("bos_token", "eos_token", "pad_token"); unset without that file.
  std::optional<int32_t> bos, eos, pad;
  // "<|im_start|>" and "<|im_end|>" when the vocabulary has them (ChatML).
  std::optional<int32_t> im_start, im_end;
};

enum class DecodeSpecial { keep, skip };

class Tokenizer {
 public:
  // A directory holding tokenizer.json (and optionally tokenizer_config.json), or the path of a
  // tokenizer.json (its directory's tokenizer_config.json is read when present). Throws lt::Error.
  static Tokenizer load(const std::string& path_or_dir);
  // From parsed files; `config` may be null (no tokenizer_config.json). `source` names them in errors.
  static Tokenizer from_json(const nlohmann::json& tokenizer, const nlohmann::json& config, const std::string& source);

  std::vector<int32_t> encode(std::string_view text, bool allow_special = true) const;
  // Appends to `out` (for building a sequence from several segments without copies).
  void encode_append(std::string_view text, std::vector<int32_t>& out, bool allow_special = true) const;
  // Throws lt::Error on an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids, DecodeSpecial special = DecodeSpecial::keep) const;

  // A token as HF names it: the vocabulary's byte-alphabet form ("Ġworld") or an added token's content.
  std::optional<int32_t> token_to_id(std::string_view token) const;
  // Throws lt::Error on an id outside the vocabulary.
  const std::string& id_to_token(int32_t id) const;
  // The raw bytes a token stands for (" world"); may be part of a UTF-8 sequence.
  const std::string& token_bytes(int32_t id) const;
  bool is_special(int32_t id) const;  // an added token marked "special"
  bool is_added(int32_t id) const;    // any added token

  // One past the largest id (HF's len(tokenizer)); the model's embedding may be larger.
  int32_t vocab_size() const;
  const SpecialTokenIds& special_ids() const;
  const std::string& source() const;  // the file it was read from
  bool regex_jit() const;             // whether PCRE2 compiled the pre-tokenizer regex with its JIT

  // The BPE cache (tests and benchmarks): entries held, and emptying it.
  size_t cache_entries() const;
  void clear_cache() const;

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Copies the tokenizer's files that exist in `from_dir` (tokenizer.json, tokenizer_config.json, vocab.json, merges.txt,
// special_tokens_map.json, generation_config.json) into `to_dir`, each atomically: a checkpoint, an exported or an
// initialised model directory carries its tokenizer.
void copy_tokenizer_files(const std::string& from_dir, const std::string& to_dir);

}  // namespace lt
