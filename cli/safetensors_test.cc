#include "cli/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

namespace gpufs::safetensors {
namespace {

using nlohmann::json;

std::string Le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file: the header JSON (padded with spaces to 8 bytes, as the
// Python library does), then `data`.
std::string MakeFile(const std::string& header_json, const std::string& data) {
  std::string h = header_json;
  while (h.size() % 8 != 0) h += ' ';
  return Le64(h.size()) + h + data;
}
std::string MakeFile(const json& header, const std::string& data) {
  return MakeFile(header.dump(), data);
}

json T(const std::string& dtype, json shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", std::move(shape)}, {"data_offsets", {begin, end}}};
}

Result<Header> Parse(const std::string& file) {
  return ParseHeader(file, file.size(), "m.safetensors");
}

std::string ErrorOf(const std::string& file) {
  auto h = Parse(file);
  if (h.ok()) return "";
  return h.status().message();
}

bool Has(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

json Valid() {
  return {
      {"__metadata__", {{"format", "pt"}, {"author", "me"}}},
      {"b", T("F32", {2, 3}, 8, 32)},
      {"a", T("BF16", {4}, 0, 8)},
      {"scalar", T("I64", json::array(), 32, 40)},
      {"empty", T("U8", {0, 5}, 40, 40)},
  };
}

TEST(Safetensors, ParsesTensorsByOffset) {
  std::string file = MakeFile(Valid(), std::string(40, 'x'));
  auto h = Parse(file);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_offset, file.size() - 40);
  EXPECT_EQ(h->data_size, 40u);
  ASSERT_EQ(h->tensors.size(), 4u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[0].dtype, "bfloat16");
  EXPECT_EQ(h->tensors[0].shape, std::vector<uint64_t>{4});
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].dtype, "float32");
  EXPECT_EQ(h->tensors[1].begin, 8u);
  EXPECT_EQ(h->tensors[1].end, 32u);
  EXPECT_EQ(h->tensors[2].name, "scalar");
  EXPECT_TRUE(h->tensors[2].shape.empty());
  EXPECT_EQ(h->tensors[3].name, "empty");
  EXPECT_EQ(h->tensors[3].size(), 0u);
  EXPECT_EQ(h->tensor_bytes(), 40u);
  ASSERT_EQ(h->metadata.size(), 2u);
  EXPECT_EQ(h->metadata[0], (std::pair<std::string, std::string>{"author", "me"}));
  EXPECT_EQ(h->metadata[1], (std::pair<std::string, std::string>{"format", "pt"}));
}

TEST(Safetensors, EveryDtype) {
  for (const char* st : {"BOOL", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "U64", "F16",
                         "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2"}) {
    auto name = DtypeName(st);
    ASSERT_TRUE(name) << st;
    EXPECT_EQ(SafetensorsDtype(*name), st);
  }
  EXPECT_FALSE(DtypeName("F4"));
  EXPECT_FALSE(SafetensorsDtype("complex128"));
}

TEST(Safetensors, EmptyHeaderAndGaps) {
  EXPECT_EQ(ErrorOf(MakeFile(json::object(), "")), "");
  // Bytes no tensor covers are allowed (and skipped by import).
  json gap = {{"a", T("U8", {2}, 0, 2)}, {"b", T("U8", {2}, 6, 8)}};
  EXPECT_EQ(ErrorOf(MakeFile(gap, std::string(10, 'x'))), "");
  // An empty tensor inside another's bytes overlaps nothing.
  json inside = {{"a", T("U8", {8}, 0, 8)}, {"e", T("U8", {0}, 4, 4)}};
  EXPECT_EQ(ErrorOf(MakeFile(inside, std::string(8, 'x'))), "");
}

TEST(Safetensors, TruncatedFile) {
  std::string file = MakeFile(Valid(), std::string(40, 'x'));
  EXPECT_TRUE(Has(ErrorOf(""), "less than the 8-byte header length"));
  EXPECT_TRUE(Has(ErrorOf(file.substr(0, 5)), "less than the 8-byte header length"));
  EXPECT_TRUE(Has(ErrorOf(file.substr(0, 20)), "runs past the end of the file"));
  // Cut inside the data: the last tensors' offsets run past the end.
  std::string message = ErrorOf(file.substr(0, file.size() - 1));
  EXPECT_TRUE(Has(message, "tensor 'empty'")) << message;  // the first in name order
  EXPECT_TRUE(Has(message, "run past the end of the data section (39 bytes")) << message;
  for (size_t cut = 0; cut < file.size(); ++cut) {
    EXPECT_FALSE(Parse(file.substr(0, cut)).ok()) << cut;
  }
}

TEST(Safetensors, HeaderLength) {
  EXPECT_TRUE(Has(ErrorOf(Le64(200ull << 20) + std::string(64, ' ')), "implausible"));
  EXPECT_TRUE(Has(ErrorOf(Le64(~0ull) + "{}"), "implausible"));
  EXPECT_TRUE(Has(ErrorOf(Le64(3) + "{}"), "runs past the end"));
}

TEST(Safetensors, BadHeaderJson) {
  EXPECT_TRUE(Has(ErrorOf(MakeFile(std::string("{\"a\": "), "")), "not valid JSON"));
  EXPECT_TRUE(Has(ErrorOf(MakeFile(std::string("not json"), "")), "not valid JSON"));
  EXPECT_TRUE(Has(ErrorOf(MakeFile(std::string("[1, 2]"), "")), "not an object"));
  EXPECT_TRUE(
      Has(ErrorOf(MakeFile(std::string("{\"a\": 1}"), "")), "tensor 'a' is not a JSON object"));
  EXPECT_TRUE(Has(ErrorOf(MakeFile(std::string("{\"a\": {\"dtype\": \"U8\"}}"), "")), "lacks"));
  EXPECT_TRUE(Has(ErrorOf(MakeFile(std::string("\"\\xff\""), "")), "not valid JSON"));
  std::string twice =
      "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, 1]}, "
      "\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [1, 2]}}";
  EXPECT_TRUE(Has(ErrorOf(MakeFile(twice, "xx")), "names 'a' twice"));
}

TEST(Safetensors, OffsetsPastTheEnd) {
  json h = {{"a", T("U8", {4}, 0, 4)}, {"b", T("U8", {4}, 4, 8)}};
  std::string message = ErrorOf(MakeFile(h, std::string(6, 'x')));
  EXPECT_TRUE(
      Has(message, "tensor 'b': data_offsets [4, 8] run past the end of the data section (6 bytes"))
      << message;
}

TEST(Safetensors, OverlappingTensors) {
  json h = {{"a", T("U8", {4}, 0, 4)}, {"b", T("U8", {4}, 2, 6)}};
  std::string message = ErrorOf(MakeFile(h, std::string(6, 'x')));
  EXPECT_TRUE(Has(message, "tensors 'a' [0, 4) and 'b' [2, 6) overlap")) << message;
  json same = {{"a", T("U8", {4}, 0, 4)}, {"b", T("U8", {4}, 0, 4)}};
  EXPECT_TRUE(Has(ErrorOf(MakeFile(same, std::string(4, 'x'))), "overlap"));
}

TEST(Safetensors, UnknownDtype) {
  json h = {{"w", T("F4", {2}, 0, 1)}};
  std::string message = ErrorOf(MakeFile(h, "x"));
  EXPECT_TRUE(Has(message, "tensor 'w' has dtype 'F4', which gpufs does not know")) << message;
  EXPECT_TRUE(Has(message, "BF16")) << message;
  EXPECT_TRUE(Has(
      ErrorOf(MakeFile(json{{"w", {{"dtype", 3}, {"shape", {1}}, {"data_offsets", {0, 1}}}}}, "x")),
      "\"dtype\" is not a string"));
}

TEST(Safetensors, ShapeSizeMismatch) {
  json h = {{"w", T("F32", {2, 3}, 0, 20)}};
  std::string message = ErrorOf(MakeFile(h, std::string(24, 'x')));
  EXPECT_TRUE(
      Has(message, "tensor 'w': shape [2, 3] of F32 is 24 bytes, but data_offsets [0, 20] hold 20"))
      << message;
  json overflow = {{"w", T("F32", {1ull << 40, 1ull << 40}, 0, 4)}};
  EXPECT_TRUE(Has(ErrorOf(MakeFile(overflow, std::string(4, 'x'))), "too large"));
}

TEST(Safetensors, BadFields) {
  auto bad = [](json tensor, const std::string& part) {
    std::string message = ErrorOf(MakeFile(json{{"w", std::move(tensor)}}, std::string(8, 'x')));
    EXPECT_TRUE(Has(message, part)) << message;
  };
  bad({{"dtype", "U8"}, {"shape", {-1}}, {"data_offsets", {0, 1}}}, "not a non-negative integer");
  bad({{"dtype", "U8"}, {"shape", {1.5}}, {"data_offsets", {0, 1}}}, "not a non-negative integer");
  bad({{"dtype", "U8"}, {"shape", 4}, {"data_offsets", {0, 4}}}, "\"shape\" is not an array");
  bad({{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {0}}}, "not [begin, end]");
  bad({{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {0, 4, 8}}}, "not [begin, end]");
  bad({{"dtype", "U8"}, {"shape", {4}}, {"data_offsets", {-1, 3}}}, "not [begin, end]");
  bad({{"dtype", "U8"}, {"shape", {0}}, {"data_offsets", {4, 2}}}, "end before they begin");
}

TEST(Safetensors, BadNames) {
  for (const std::string& name :
       {std::string("a/b"), std::string("."), std::string(".."), std::string(".gpufs"),
        std::string(".gpufs-x"), std::string(256, 'n'), std::string("a\0b", 3)}) {
    json h = {{name, T("U8", {1}, 0, 1)}};
    EXPECT_FALSE(Parse(MakeFile(h, "x")).ok()) << name;
  }
  EXPECT_TRUE(Parse(MakeFile(json{{std::string(255, 'n'), T("U8", {1}, 0, 1)}}, "x")).ok());
  EXPECT_TRUE(Parse(MakeFile(json{{"model.layers.0.weight", T("U8", {1}, 0, 1)}}, "x")).ok());
}

TEST(Safetensors, BadMetadata) {
  auto bad = [](json meta, const std::string& part) {
    std::string message = ErrorOf(MakeFile(json{{"__metadata__", std::move(meta)}}, ""));
    EXPECT_TRUE(Has(message, part)) << message;
  };
  bad(json::array(), "\"__metadata__\" is not a JSON object");
  bad({{"n", 1}}, "not a string");
  bad({{"gpufs.type", "x"}}, "reserved");
  bad({{"", "x"}}, "empty key");
  bad({{std::string(251, 'k'), "x"}}, "too long");
  bad({{"k", std::string(65537, 'v')}}, "more than an extended attribute holds");
}

TEST(Safetensors, ReadsFromAFile) {
  char path[] = "/tmp/gpufs-st-test-XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  std::string file = MakeFile(Valid(), std::string(40, 'x'));
  ASSERT_EQ(::write(fd, file.data(), file.size()), static_cast<ssize_t>(file.size()));
  auto h = ReadHeader(fd, file.size(), path);
  auto truncated = ReadHeader(fd, 30, path);
  ::close(fd);
  ::unlink(path);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors.size(), 4u);
  EXPECT_FALSE(truncated.ok());
}

}  // namespace
}  // namespace gpufs::safetensors
