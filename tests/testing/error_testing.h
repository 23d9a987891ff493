// tests/testing/error_testing.h — asserting that a call fails with lt::Error and a message naming what went wrong.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace lt::testing {

// f() must throw lt::Error whose message contains every needle (each missing one is reported).
inline void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected lt::Error, nothing was thrown";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

}  // namespace lt::testing
