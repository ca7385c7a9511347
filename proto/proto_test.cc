#include <gtest/gtest.h>

#include "proto/dtypes.h"
#include "proto/names.h"
#include "proto/shape.h"

namespace gpufs::proto {
namespace {

TEST(Dtype, KnownNamesAndSizes) {
  EXPECT_EQ(*DtypeSize("float32"), 4u);
  EXPECT_EQ(*DtypeSize("bfloat16"), 2u);
  EXPECT_EQ(*DtypeSize("complex128"), 16u);
  EXPECT_FALSE(DtypeSize("float24"));
  EXPECT_TRUE(CheckDtype("int64").ok());
  EXPECT_EQ(CheckDtype("f4").code(), EINVAL);
}

TEST(Dtype, EveryProtocolNameMapsBack) {
  for (const Dtype& d : Dtypes()) {
    EXPECT_EQ(FindDtype(d.name), &d);
    if (!d.safetensors.empty()) {
      EXPECT_EQ(FindSafetensorsDtype(d.safetensors), &d) << d.name;
    }
    if (d.npy_exact) {
      EXPECT_EQ(FindNpyType(d.npy_kind, d.itemsize), &d) << d.name;
    }
  }
  EXPECT_EQ(NpyDescr(*FindDtype("float32")), "<f4");
  EXPECT_EQ(NpyDescr(*FindDtype("bool")), "|b1");
  EXPECT_EQ(NpyDescr(*FindDtype("bfloat16")), "<u2");  // numpy has none: the bits as uint16
  EXPECT_EQ(FindNpyType('u', 2)->name, "uint16");
  EXPECT_EQ(FindSafetensorsDtype("BF16")->name, "bfloat16");
  EXPECT_EQ(FindSafetensorsDtype("F4"), nullptr);
}

TEST(Shape, ParsesCommaSeparatedDims) {
  EXPECT_EQ(*ParseShape("1024,1024"), (std::vector<uint64_t>{1024, 1024}));
  EXPECT_EQ(*ParseShape("3"), (std::vector<uint64_t>{3}));
  EXPECT_EQ(*ParseShape("2, 0, 5"), (std::vector<uint64_t>{2, 0, 5}));
  EXPECT_TRUE(ParseShape("")->empty());
  for (const char* bad : {"1,,2", "a", "-1", "1.5", ",", "99999999999999999999999"}) {
    EXPECT_EQ(ParseShape(bad).status().code(), EINVAL) << bad;
  }
  std::vector<uint64_t> dims = {2, 3};
  EXPECT_EQ(FormatShape(dims), "2,3");
  EXPECT_EQ(FormatShape({}), "");
}

TEST(Shape, TensorSizeMustMatch) {
  EXPECT_TRUE(CheckTensorSize("float32", std::vector<uint64_t>{2, 3}, 24).ok());
  EXPECT_EQ(CheckTensorSize("float32", std::vector<uint64_t>{1024, 1024}, 6).code(), EINVAL);
  EXPECT_TRUE(CheckTensorSize("float32", std::nullopt, 8).ok());
  EXPECT_EQ(CheckTensorSize("float32", std::nullopt, 6).code(), EINVAL);
  EXPECT_TRUE(CheckTensorSize("int8", std::vector<uint64_t>{}, 1).ok());  // a scalar
  EXPECT_EQ(CheckTensorSize("float64", std::vector<uint64_t>{1ull << 40, 1ull << 40}, 8).code(),
            EINVAL);
  EXPECT_EQ(CheckTensorSize("float24", std::nullopt, 8).code(), EINVAL);
}

TEST(Names, MemberNames) {
  EXPECT_TRUE(CheckName("weights").ok());
  EXPECT_TRUE(CheckName(".gpufs").ok());  // reserved only at the root, by the daemon
  for (std::string_view bad : {std::string_view(""), std::string_view("."), std::string_view(".."),
                               std::string_view("a/b"), std::string_view("a\0b", 3)}) {
    EXPECT_EQ(CheckName(bad).code(), EINVAL);
  }
  EXPECT_EQ(CheckName(std::string(256, 'x')).code(), ENAMETOOLONG);
}

}  // namespace
}  // namespace gpufs::proto
