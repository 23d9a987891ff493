// Exact-match evaluation: answer extraction as GSM8K and MetaMathQA write answers.
#include <gtest/gtest.h>

#include "train/evaluate.h"

namespace lt {
namespace {

TEST(ExtractAnswer, FormatsUsersWrite) {
  EXPECT_EQ(extract_answer("She has 3 + 4 = 7 apples.\n#### 7"), "7");
  EXPECT_EQ(extract_answer("The total is 1,234 + 5 = 1,239.\n#### 1,239"), "1239");
  EXPECT_EQ(extract_answer("12 * 3 = 36. The answer is: 36"), "36");
  EXPECT_EQ(extract_answer("So the answer is 42."), "42");
  EXPECT_EQ(extract_answer("We get -5 after all, then 10 minus 15 is -5"), "-5");
  EXPECT_EQ(extract_answer("about 3.25 dollars"), "3.25");
  EXPECT_EQ(extract_answer("no numbers here"), "");
  EXPECT_EQ(extract_answer("The answer is: 12. Then 99 more words 7"), "12");  // the marker wins over the last number
  EXPECT_EQ(extract_answer("#### 8\n"), "8");
}

}  // namespace
}  // namespace lt
