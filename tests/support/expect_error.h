#pragma once
// Expecting an nvfp4mla::Error with a given message: a check that the intended validation fired,
// not just that something threw.
#include <gtest/gtest.h>

#include <string>

#include "nvfp4mla/error.h"

namespace nvfp4mla::testing {

// Expects `f` to throw nvfp4mla::Error whose message contains `needle`.
template <class F>
void expect_error_containing(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an Error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace nvfp4mla::testing
