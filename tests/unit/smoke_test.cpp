#include <gtest/gtest.h>
#include "nvfp4mla/record.h"
TEST(Smoke, RecordWidths) {
  EXPECT_EQ(nvfp4mla::kSpecNvfp4Fp8Rope.record_bytes(), 368);
  EXPECT_EQ(nvfp4mla::kSpecNvfp4Bf16Rope.record_bytes(), 432);
  EXPECT_EQ(nvfp4mla::kSpecFp8.record_bytes(), 656);
  EXPECT_EQ(nvfp4mla::kSpecBf16.record_bytes(), 1152);
}
