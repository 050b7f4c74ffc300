// placeholder, replaced below
#include <gtest/gtest.h>
TEST(DeviceCodecTest, Placeholder) { GTEST_SKIP(); }
