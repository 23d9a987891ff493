// `lazytrain tokenize` end to end: the binary built next to the tests, on the real Qwen3 tokenizer.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "text_testing.h"

#include "testing/cli_testing.h"

namespace lt {
namespace {

using testing::CmdResult;

CmdResult run_cmd(const std::string& args) { return testing::run_lazytrain("tokenize " + args); }

class CmdTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(std::string(LT_BINARY_DIR) + "/lazytrain"))
        << "build the lazytrain target first";
  }
};

TEST_F(CmdTokenize, JsonIdsEqualTheLibrary) {
  LT_REQUIRE_QWEN3();
  const std::string text = "Hello, 世界! <|im_end|>";
  CmdResult r = run_cmd("--tokenizer " + testing::qwen3_dir() + " --json --text '" + text + "'");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ids"].get<std::vector<int32_t>>(), testing::qwen3_tokenizer().encode(text));
  // --no-special: the special token is text.
  r = run_cmd("--tokenizer " + testing::qwen3_dir() + "/tokenizer.json --json --no-special --text '<|im_end|>'");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>(),
            testing::qwen3_tokenizer().encode("<|im_end|>", false));
}

TEST_F(CmdTokenize, PrintsPieces) {
  LT_REQUIRE_QWEN3();
  std::string file = ::testing::TempDir() + "lt_cmd_tokenize_" + std::to_string(::getpid()) + ".txt";
  std::ofstream(file) << "Hello world\n\t\xf0\x9f\xab\xa0<|im_end|>";
  CmdResult r = run_cmd("--tokenizer " + testing::qwen3_dir() + " --text-file " + file);
  std::filesystem::remove(file);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("ids: [9707, 1879"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("     9707  \"Hello\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("     1879  \" world\"\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\\xf0"), std::string::npos) << r.out;  // a partial character, as bytes
  EXPECT_NE(r.out.find("   151645  \"<|im_end|>\"  (special)\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" tokens, 27 bytes\n"), std::string::npos) << r.out;
}

TEST_F(CmdTokenize, ErrorsAreOneLineAndNonZero) {
  CmdResult r = run_cmd("--tokenizer /nonexistent/dir --text hi");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("lazytrain: error: /nonexistent/dir"), std::string::npos) << r.out;
  r = run_cmd("--tokenizer /nonexistent/dir");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find("--text"), std::string::npos) << r.out;
  r = run_cmd("--tokenizer x --text a --text-file b");
  EXPECT_NE(r.status, 0);
}

}  // namespace
}  // namespace lt
