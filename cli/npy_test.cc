#include "cli/npy.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "proto/dtypes.h"

namespace gpufs::npy {
namespace {

// A .npy file: `dict` wrapped in the given version's prefix, then `data`.
std::string Wrap(const std::string& dict, const std::string& data, int major = 1) {
  std::string header = dict + "\n";
  std::string out(kMagic);
  out += static_cast<char>(major);
  out += '\0';
  size_t len_bytes = major == 1 ? 2 : 4;
  for (size_t i = 0; i < len_bytes; ++i)
    out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string Dict(const std::string& descr, const std::string& shape,
                 const std::string& fortran = "False") {
  return "{'descr': '" + descr + "', 'fortran_order': " + fortran + ", 'shape': " + shape + ", }";
}

Result<Header> Parse(const std::string& file) { return ParseHeader(file, file.size(), "x.npy"); }

// The message of a failed parse ("" if it succeeded).
std::string ErrorOf(const std::string& file) {
  auto h = Parse(file);
  if (h.ok()) return "";
  EXPECT_EQ(h.status().code(), EINVAL) << h.status().ToString();
  return h.status().message();
}

TEST(NpyHeader, BuildsWhatNumpyWrites) {
  // np.save(f, np.zeros((2, 3), np.float32)) with numpy 1.24.
  std::string expected = std::string("\x93NUMPY\x01\x00v\x00", 10) +
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }" +
                         std::string(58, ' ') + "\n";
  std::vector<uint64_t> shape = {2, 3};
  EXPECT_EQ(BuildHeader("<f4", shape), expected);
  EXPECT_EQ(BuildHeader("<f4", shape).size(), 128u);
  // np.float64(3.0): a scalar.
  std::string scalar = BuildHeader("<f8", std::vector<uint64_t>{});
  EXPECT_EQ(scalar.size(), 128u);
  EXPECT_NE(scalar.find("'shape': (), }"), std::string::npos);
  EXPECT_NE(BuildHeader("|u1", std::vector<uint64_t>{5}).find("'shape': (5,), }"),
            std::string::npos);
}

TEST(NpyHeader, HeadersAreAlignedTo64) {
  for (size_t dims = 0; dims < 40; ++dims) {
    std::vector<uint64_t> shape(dims, 7);
    std::string h = BuildHeader("<i8", shape);
    EXPECT_EQ(h.size() % 64, 0u) << dims;
    EXPECT_EQ(h.back(), '\n');
  }
}

TEST(NpyHeader, RoundTrip) {
  struct Case {
    std::string dtype;
    std::vector<uint64_t> shape;
  };
  std::vector<Case> cases = {
      {"float32", {2, 3}}, {"uint8", {5}},        {"float64", {}},   {"int16", {0}},
      {"bool", {4, 1}},    {"complex64", {2, 2}}, {"float16", {3}},  {"int64", {1, 1, 1, 2}},
      {"uint64", {3}},     {"complex128", {1}},   {"int8", {10, 0}}, {"uint32", {123456789}},
  };
  for (const auto& c : cases) {
    auto descr = DescrForDtype(c.dtype);
    ASSERT_TRUE(descr) << c.dtype;
    EXPECT_TRUE(descr->exact);
    uint64_t bytes = *proto::DtypeSize(c.dtype);
    for (uint64_t d : c.shape) bytes *= d;
    std::string header = BuildHeader(descr->descr, c.shape);
    // Keep the file small for the big shape: parse with the size it would have.
    std::string file = header + std::string(std::min<uint64_t>(bytes, 64), 'x');
    auto h = ParseHeader(file, header.size() + bytes, "x.npy");
    ASSERT_TRUE(h.ok()) << c.dtype << ": " << h.status().ToString();
    EXPECT_EQ(h->dtype, c.dtype);
    EXPECT_EQ(h->descr, descr->descr);
    EXPECT_EQ(h->shape, c.shape);
    EXPECT_EQ(h->data_offset, header.size());
    EXPECT_EQ(h->data_size, bytes);
    EXPECT_EQ(h->major, 1);
  }
}

TEST(NpyHeader, StandInsForTypesNumpyLacks) {
  EXPECT_EQ(DescrForDtype("bfloat16")->descr, "<u2");
  EXPECT_FALSE(DescrForDtype("bfloat16")->exact);
  EXPECT_EQ(DescrForDtype("float8_e4m3fn")->descr, "|u1");
  EXPECT_EQ(DescrForDtype("float8_e5m2")->descr, "|u1");
  EXPECT_FALSE(DescrForDtype("float128"));
}

TEST(NpyHeader, Versions2And3) {
  std::string data(24, 'd');
  for (int major : {2, 3}) {
    auto h = Parse(Wrap(Dict("<f4", "(2, 3)"), data, major));
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->major, major);
    EXPECT_EQ(h->data_offset, 12 + Dict("<f4", "(2, 3)").size() + 1);
    EXPECT_EQ(h->data_size, 24u);
  }
  // A header too long for 1.0 is written as 2.0.
  std::vector<uint64_t> many(30000, 1);
  std::string big = BuildHeader("<f4", many);
  EXPECT_EQ(big[6], 2);
  EXPECT_EQ(big.size() % 64, 0u);
  auto h = ParseHeader(big + "abcd", big.size() + 4, "x.npy");
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->shape.size(), 30000u);
}

TEST(NpyHeader, AcceptsWhatPythonWrites) {
  // Double quotes, no trailing comma, any key order, Python 2 longs, 1-D Fortran.
  EXPECT_TRUE(Parse(Wrap("{\"shape\": (2L,), \"descr\": \"<i4\", \"fortran_order\": False}",
                         std::string(8, 'x')))
                  .ok());
  EXPECT_TRUE(Parse(Wrap(Dict("<f4", "(4,)", "True"), std::string(16, 'x'))).ok());
  EXPECT_TRUE(Parse(Wrap(Dict("<f4", "(4, 1)", "True"), std::string(16, 'x'))).ok());
  EXPECT_TRUE(Parse(Wrap(Dict(">u1", "(4,)"), std::string(4, 'x'))).ok());
  EXPECT_TRUE(Parse(Wrap(Dict("<f4", "()"), std::string(4, 'x'))).ok());
  // Void data parses (dtype unknown to gpufs): put then wants --dtype.
  auto v = Parse(Wrap(Dict("|V2", "(3,)"), std::string(6, 'x')));
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->dtype, "");
  EXPECT_EQ(v->itemsize, 2u);
}

TEST(NpyHeader, TruncatedDataNamesBothNumbers) {
  std::string header = BuildHeader("<f4", std::vector<uint64_t>{1000});
  EXPECT_EQ(ErrorOf(header + std::string(3996, 'x')),
            "x.npy: header says 1000 float32 = 4000 bytes, file has 3996 after the header");
  EXPECT_EQ(ErrorOf(header + std::string(4001, 'x')),
            "x.npy: header says 1000 float32 = 4000 bytes, file has 4001 after the header");
  EXPECT_EQ(ErrorOf(header),
            "x.npy: header says 1000 float32 = 4000 bytes, file has 0 after the header");
}

TEST(NpyHeader, RefusesMalformations) {
  std::string good = Wrap(Dict("<f4", "(2,)"), std::string(8, 'x'));
  ASSERT_EQ(ErrorOf(good), "");
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  // Magic, version, length.
  EXPECT_TRUE(has(ErrorOf(""), "not a .npy file"));
  EXPECT_TRUE(has(ErrorOf("PK\x03\x04 zip"), "not a .npy file"));
  EXPECT_TRUE(has(ErrorOf(good.substr(0, 7)), "truncated"));
  EXPECT_TRUE(has(ErrorOf(good.substr(0, 9)), "truncated"));
  std::string v11 = good;
  v11[7] = 1;
  EXPECT_TRUE(has(ErrorOf(v11), "unsupported .npy format version 1.1"));
  std::string v4 = good;
  v4[6] = 4;
  EXPECT_TRUE(has(ErrorOf(v4), "version 4.0"));
  EXPECT_TRUE(has(ErrorOf(good.substr(0, 40)), "runs past the end of the file"));
  std::string huge = std::string(kMagic) + std::string("\x02\x00\xff\xff\xff\x7f", 6) + "{}";
  EXPECT_TRUE(has(ErrorOf(huge), "too large"));

  // The dict.
  auto bad = [&](const std::string& dict, const std::string& part) {
    std::string message = ErrorOf(Wrap(dict, std::string(8, 'x')));
    EXPECT_TRUE(has(message, part)) << dict << " -> " << message;
  };
  bad("[1, 2]", "not a valid dict literal");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)", "expected ',' or '}'");
  bad("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", "unexpected text");
  bad("{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", "not a valid dict literal");
  bad("{'descr': '<f4', 'fortran_order': False}", "lacks the key 'shape'");
  bad("{'descr': '<f4', 'shape': (2,)}", "lacks the key 'fortran_order'");
  bad(Dict("<f4", "(2,)").substr(0, Dict("<f4", "(2,)").size() - 1) + "'extra': 1, }",
      "unknown key 'extra'");
  bad("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", "appears twice");
  bad("{'descr': 4, 'fortran_order': False, 'shape': (2,)}", "'descr' is not a string");
  bad("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,)}", "structured dtypes");
  bad(Dict("<f4", "(2,)", "0"), "'fortran_order' is not True or False");
  bad(Dict("<f4", "(2,)", "Truex"), "not a valid dict literal");
  bad(Dict("<f4", "(2)"), "'shape' is not a tuple");
  bad(Dict("<f4", "[2]"), "'shape' is not a tuple");
  bad(Dict("<f4", "(-2,)"), "negative integer");
  bad(Dict("<f4", "(2.5,)"), "expected ',' or ')'");
  bad(Dict("<f4", "((2,),)"), "nested tuple");
  bad(Dict("<f4", "(99999999999999999999999,)"), "out of range");
  bad(Dict("<f4", "(02,)"), "leading zero");
  bad(Dict("<f\\x34", "(2,)"), "escape sequences");
  bad(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (2,)}\0", 57), "not text");
  // Layouts and types.
  bad(Dict("<f4", "(2, 2)", "True"), "Fortran-order arrays are not supported");
  bad(Dict(">f4", "(2,)"), "big-endian");
  bad(Dict("|O", "(2,)"), "pickled Python objects");
  bad(Dict("<M8[ns]", "(2,)"), "datetime");
  bad(Dict("<x4", "(2,)"), "not a numpy type string");
  bad(Dict("<f", "(2,)"), "not a numpy type string");
  bad(Dict("|b2", "(2,)"), "bool is 'b1'");
  bad(Dict("|V0", "(2,)"), "zero-byte elements");
  bad(Dict("<f4", "(4294967296, 4294967296, 4294967296)"), "is too large");
}

TEST(NpyHeader, DescrNames) {
  EXPECT_EQ(ParseDescr("<f4")->dtype, "float32");
  EXPECT_EQ(ParseDescr("|b1")->dtype, "bool");
  EXPECT_EQ(ParseDescr("<c16")->dtype, "complex128");
  EXPECT_EQ(ParseDescr("=i8")->dtype, "int64");
  EXPECT_EQ(ParseDescr("u2")->dtype, "uint16");
  EXPECT_EQ(ParseDescr("<U3")->itemsize, 12u);
  EXPECT_EQ(ParseDescr("|S5")->itemsize, 5u);
  EXPECT_EQ(ParseDescr("<f16")->dtype, "");  // long double: known size, no gpufs type
  EXPECT_FALSE(ParseDescr(">i2").ok());
  EXPECT_FALSE(ParseDescr("").ok());
}

TEST(NpyHeader, ReadsFromAFile) {
  char path[] = "/tmp/gpufs-npy-test-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string file = BuildHeader("<i2", std::vector<uint64_t>{3, 2}) + std::string(12, 'z');
  ASSERT_EQ(::write(fd, file.data(), file.size()), static_cast<ssize_t>(file.size()));
  auto h = ReadHeader(fd, file.size(), path);
  ::close(fd);
  ::unlink(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->dtype, "int16");
  EXPECT_EQ(h->shape, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(h->data_offset, 128u);
}

}  // namespace
}  // namespace gpufs::npy
