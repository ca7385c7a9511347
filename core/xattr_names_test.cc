#include "core/xattr_names.h"

#include <gtest/gtest.h>

namespace gpufs::xattr {
namespace {

TEST(Dtype, KnownNamesAndSizes) {
  EXPECT_EQ(*DtypeSize("float32"), 4u);
  EXPECT_EQ(*DtypeSize("bfloat16"), 2u);
  EXPECT_EQ(*DtypeSize("complex128"), 16u);
  EXPECT_FALSE(DtypeSize("float24"));
  EXPECT_TRUE(CheckDtype("int64").ok());
  EXPECT_EQ(CheckDtype("f4").code(), EINVAL);
}

TEST(Shape, ParsesCommaSeparatedDims) {
  EXPECT_EQ(*ParseShape("1024,1024"), (std::vector<uint64_t>{1024, 1024}));
  EXPECT_EQ(*ParseShape("3"), (std::vector<uint64_t>{3}));
  EXPECT_EQ(*ParseShape("2, 0, 5"), (std::vector<uint64_t>{2, 0, 5}));
  EXPECT_TRUE(ParseShape("")->empty());
  for (const char* bad : {"1,,2", "a", "-1", "1.5", ",", "99999999999999999999999"}) {
    EXPECT_EQ(ParseShape(bad).status().code(), EINVAL) << bad;
  }
}

}  // namespace
}  // namespace gpufs::xattr
