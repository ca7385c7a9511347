#include "cluster/base64.h"

#include <gtest/gtest.h>

namespace gpufs::cluster {
namespace {

TEST(Base64, EncodesRfc4648Vectors) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foob"), "Zm9vYg==");
  EXPECT_EQ(Base64Encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
}

TEST(Base64, RoundTripsEveryByte) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n = 0; n <= all.size(); n += 17) {
    std::string part = all.substr(0, n);
    auto back = Base64Decode(Base64Encode(part));
    ASSERT_TRUE(back.has_value()) << n;
    EXPECT_EQ(*back, part);
  }
}

TEST(Base64, RejectsWhatIsNotPaddedBase64) {
  EXPECT_FALSE(Base64Decode("Zm9").has_value());       // not a multiple of 4
  EXPECT_FALSE(Base64Decode("Zm9v!A==").has_value());  // outside the alphabet
  EXPECT_FALSE(Base64Decode("Z===").has_value());      // too much padding
  EXPECT_FALSE(Base64Decode("Zg==Zg==").has_value());  // padding before the end
  EXPECT_FALSE(Base64Decode("Zm=v").has_value());      // data after padding
  EXPECT_EQ(Base64Decode("Zm8=").value_or("?"), "fo");
}

}  // namespace
}  // namespace gpufs::cluster
