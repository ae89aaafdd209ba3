#include <gtest/gtest.h>
#include "nvfp4mla/device.h"
TEST(GpuSmoke, DeviceVisible) {
  if (nvfp4mla::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  EXPECT_NE(nvfp4mla::cuda_device_description(0).find("sm_"), std::string::npos);
}
