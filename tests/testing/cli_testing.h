// tests/testing/cli_testing.h — running the `lazytrain` binary built next to the tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace lt::testing {

struct CmdResult {
  int status;       // the exit status, or -1 when the command did not exit normally
  std::string out;  // stdout and stderr
};

// Runs `lazytrain ARGS` (ARGS as a shell would split them) and collects its output.
inline CmdResult run_lazytrain(const std::string& args) {
  const std::string cmd = std::string(LT_BINARY_DIR) + "/lazytrain " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  std::string out;
  char buf[4096];
  size_t n;
  while (p && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace lt::testing
