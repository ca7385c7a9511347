#include "util/status.h"

#include <gtest/gtest.h>

namespace gpufs {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return Error(EINVAL, "odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  GPUFS_ASSIGN_OR_RETURN(int h, Half(x));
  return Half(h);
}

TEST(Status, CarriesErrnoAndContext) {
  Status s = PosixError("open /x", ENOENT);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), ENOENT);
  EXPECT_EQ(s.ToString(), "ENOENT: open /x: No such file or directory");
  EXPECT_EQ(s.Prepend("put").message(), "put: open /x: No such file or directory");
  EXPECT_EQ(s.Prepend("put").code(), ENOENT);
  EXPECT_EQ(Status().ToString(), "OK");
}

TEST(Result, PropagatesErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  auto r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), EINVAL);
  Result<int> from_ok = Status();
  EXPECT_FALSE(from_ok.ok());
}

}  // namespace
}  // namespace gpufs
