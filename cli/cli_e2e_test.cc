// The CLI's data commands on a real mount: put/get of .npy files against what
// numpy writes and reads, import of safetensors files (and stat of an object
// too large for its attribute), and the promise that a refused or failed
// command leaves the namespace as it was. ls and stat: ls_stat_e2e_test.cc.
#include <gtest/gtest.h>
#include <sys/xattr.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/support/mount_fixture.h"

namespace gpufs::e2e {
namespace {

using nlohmann::json;

constexpr const char* kPython = "/usr/bin/python3";

bool HaveNumpy() {
  static const bool have = Sh(std::string(kPython) + " -c 'import numpy'").status == 0;
  return have;
}

std::string Le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s += static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A safetensors file from a header (padded to 8 bytes) and a data section.
std::string Safetensors(const json& header, const std::string& data) {
  std::string h = header.dump();
  while (h.size() % 8 != 0) h += ' ';
  return Le64(h.size()) + h + data;
}

json T(const std::string& dtype, json shape, uint64_t begin, uint64_t end) {
  return {{"dtype", dtype}, {"shape", std::move(shape)}, {"data_offsets", {begin, end}}};
}

class CliE2E : public MountedTest {
 protected:
  // Without GPUFS_TRACE: the output is what a user sees, also when a GPU
  // check runs with traces on.
  ShResult Gpufs(const std::string& args) {
    return Sh("env -u GPUFS_TRACE " + GpufsBin() + " " + args);
  }
  // Everything in the namespace, with sizes and attributes, one line each.
  std::string Listing() {
    return Sh("cd " + mount_.mnt() +
              " && find . -printf '%p %s\\n' | sort && getfattr -R -d . 2>/dev/null")
        .output;
  }
  // Runs a Python script with numpy; its output.
  ShResult Py(const std::string& script) {
    WriteFile(L("script.py"), "import numpy as np\n" + script);
    return Sh(std::string(kPython) + " " + L("script.py"));
  }
};

// --- .npy ---------------------------------------------------------------------

TEST_F(CliE2E, NpyPutGetIsByteIdenticalToNumpy) {
  if (!HaveNumpy()) GTEST_SKIP() << "no numpy for " << kPython;
  struct Case {
    std::string name, expr, dtype, shape;
  };
  std::vector<Case> cases = {
      {"f32", "(np.arange(24, dtype=np.float32) * 1.5).reshape(2, 3, 4)", "float32", "2,3,4"},
      {"u8", "np.arange(200, dtype=np.uint8)", "uint8", "200"},
      {"f64s", "np.float64(3.25)", "float64", ""},
      {"i16e", "np.zeros((0,), np.int16)", "int16", "0"},
      {"b", "np.array([[True, False], [False, True]])", "bool", "2,2"},
      {"c64", "np.arange(6, dtype=np.complex64) * (1 + 2j)", "complex64", "6"},
      {"f16", "np.linspace(0, 1, 7).astype(np.float16)", "float16", "7"},
      {"i64", "np.arange(-30, 30, dtype=np.int64).reshape(3, 4, 5)", "int64", "3,4,5"},
      {"big", "np.random.default_rng(1).random((1000, 700), dtype=np.float32)", "float32",
       "1000,700"},
  };
  std::string script;
  for (const auto& c : cases) script += "np.save('" + L(c.name + ".npy") + "', " + c.expr + ")\n";
  auto made = Py(script);
  ASSERT_EQ(made.status, 0) << made.output;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::string file = ReadFile(L(c.name + ".npy"));
    auto put = Gpufs("put -p " + L(c.name + ".npy") + " " + P("arrays/" + c.name));
    ASSERT_EQ(put.status, 0) << put.output;
    EXPECT_EQ(Xattr(P("arrays/" + c.name), "user.gpufs.dtype"), c.dtype);
    EXPECT_EQ(Xattr(P("arrays/" + c.name), "user.gpufs.shape"), c.shape);
    // Only the data is stored: the header ends at the first '\n' after the magic.
    std::string data = file.substr(file.find('\n') + 1);
    EXPECT_TRUE(ReadFile(P("arrays/" + c.name)) == data);
    auto get = Gpufs("get " + P("arrays/" + c.name) + " " + L(c.name + ".back.npy"));
    ASSERT_EQ(get.status, 0) << get.output;
    EXPECT_TRUE(ReadFile(L(c.name + ".back.npy")) == file) << "not byte-identical";
    auto load =
        Py("a = np.load('" + L(c.name + ".npy") + "'); b = np.load('" + L(c.name + ".back.npy") +
           "')\nassert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)\n");
    EXPECT_EQ(load.status, 0) << load.output;
  }
  // --raw keeps the header; a .npy name is detected by its magic too.
  ASSERT_EQ(Gpufs("put --raw " + L("u8.npy") + " " + P("raw")).status, 0);
  EXPECT_TRUE(ReadFile(P("raw")) == ReadFile(L("u8.npy")));
  EXPECT_EQ(Xattr(P("raw"), "user.gpufs.dtype"), "<ENODATA>");
  ASSERT_EQ(Sh("cp " + L("u8.npy") + " " + L("u8.bin")).status, 0);
  ASSERT_EQ(Gpufs("put " + L("u8.bin") + " " + P("sniffed")).status, 0);
  EXPECT_EQ(Xattr(P("sniffed"), "user.gpufs.dtype"), "uint8");
  ASSERT_EQ(Gpufs("get --raw " + P("raw") + " " + L("raw.npy")).status, 0);
  EXPECT_TRUE(ReadFile(L("raw.npy")) == ReadFile(L("u8.npy")));
}

TEST_F(CliE2E, NpyDtypeAndShapeOverrides) {
  if (!HaveNumpy()) GTEST_SKIP() << "no numpy for " << kPython;
  ASSERT_EQ(Py("np.save('" + L("a.npy") + "', np.ones((2, 3), np.float32))").status, 0);
  std::string before = Listing();
  auto mismatch = Gpufs("put --dtype uint8 " + L("a.npy") + " " + P("o/a"));
  EXPECT_NE(mismatch.status, 0);
  EXPECT_NE(
      mismatch.output.find("dtype uint8 with shape (2, 3) is 6 bytes, but there are 24 bytes"),
      std::string::npos)
      << mismatch.output;
  EXPECT_EQ(Listing(), before);
  auto bad_dtype = Gpufs("put --dtype float31 " + L("a.npy") + " " + P("o/a"));
  EXPECT_EQ(bad_dtype.status, 2);  // a usage error
  EXPECT_NE(bad_dtype.output.find("unknown dtype 'float31'"), std::string::npos)
      << bad_dtype.output;
  EXPECT_EQ(Listing(), before);

  ASSERT_EQ(Gpufs("put -p --dtype int32 " + L("a.npy") + " " + P("o/a")).status, 0);
  EXPECT_EQ(Xattr(P("o/a"), "user.gpufs.dtype"), "int32");
  EXPECT_EQ(Xattr(P("o/a"), "user.gpufs.shape"), "2,3");
  ASSERT_EQ(Gpufs("put --dtype uint8 --shape 24 " + L("a.npy") + " " + P("o/a")).status, 0);
  EXPECT_EQ(Xattr(P("o/a"), "user.gpufs.dtype"), "uint8");
  EXPECT_EQ(Xattr(P("o/a"), "user.gpufs.shape"), "24");
  ASSERT_EQ(Gpufs("put --shape 3,2 " + L("a.npy") + " " + P("o/a")).status, 0);
  EXPECT_EQ(Xattr(P("o/a"), "user.gpufs.dtype"), "float32");
  EXPECT_EQ(Xattr(P("o/a"), "user.gpufs.shape"), "3,2");
  // Plain files: dtype and shape must describe the bytes too.
  WriteFile(L("plain"), std::string(10, 'p'));
  EXPECT_NE(Gpufs("put --dtype float32 " + L("plain") + " " + P("o/p")).status, 0);
  EXPECT_NE(Gpufs("put --dtype uint8 --shape 3,3 " + L("plain") + " " + P("o/p")).status, 0);
  ASSERT_EQ(Gpufs("put --dtype int16 --shape 5 " + L("plain") + " " + P("o/p")).status, 0);
  EXPECT_EQ(Xattr(P("o/p"), "user.gpufs.shape"), "5");
}

TEST_F(CliE2E, GetNpyFromBlobAttributes) {
  if (!HaveNumpy()) GTEST_SKIP() << "no numpy for " << kPython;
  // No dtype: uint8, 1-D.
  WriteFile(L("bytes"), RandomBytes(1000, 3));
  ASSERT_EQ(Gpufs("put " + L("bytes") + " " + P("b")).status, 0);
  ASSERT_EQ(Gpufs("get " + P("b") + " " + L("b.npy")).status, 0);
  auto load =
      Py("a = np.load('" + L("b.npy") + "')\nassert a.dtype == np.uint8 and a.shape == (1000,)\n" +
         "assert a.tobytes() == open('" + L("bytes") + "', 'rb').read()\n");
  EXPECT_EQ(load.status, 0) << load.output;
  // bfloat16: numpy has none; its bits arrive as uint16, with a note.
  WriteFile(L("bf"), RandomBytes(12, 4));
  ASSERT_EQ(Gpufs("put --dtype bfloat16 --shape 2,3 " + L("bf") + " " + P("bf")).status, 0);
  auto get = Gpufs("get " + P("bf") + " " + L("bf.npy"));
  ASSERT_EQ(get.status, 0) << get.output;
  EXPECT_NE(get.output.find("numpy has no bfloat16"), std::string::npos) << get.output;
  load =
      Py("a = np.load('" + L("bf.npy") + "')\nassert a.dtype == np.uint16 and a.shape == (2, 3)\n");
  EXPECT_EQ(load.status, 0) << load.output;
  // A dtype without a shape: 1-D. A shape that does not fit: the daemon
  // refuses it (EINVAL), and get still writes the 1-D array.
  ASSERT_EQ(::setxattr(P("b").c_str(), "user.gpufs.dtype", "int32", 5, 0), 0);
  ASSERT_EQ(Gpufs("get " + P("b") + " " + L("i.npy")).status, 0);
  EXPECT_EQ(Py("assert np.load('" + L("i.npy") + "').shape == (250,)").status, 0);
  errno = 0;
  EXPECT_EQ(::setxattr(P("b").c_str(), "user.gpufs.shape", "3,3", 3, 0), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_EQ(Gpufs("get " + P("b") + " " + L("i2.npy")).status, 0);
  EXPECT_EQ(Py("assert np.load('" + L("i2.npy") + "').shape == (250,)").status, 0);
}

TEST_F(CliE2E, MalformedNpyIsRefusedAndCreatesNothing) {
  std::string header = std::string("\x93NUMPY\x01\x00", 8);
  auto npy = [&](const std::string& dict, const std::string& data) {
    std::string h = dict + "\n";
    return header + static_cast<char>(h.size() & 0xff) + static_cast<char>(h.size() >> 8) + h +
           data;
  };
  struct Case {
    std::string name, bytes, message;
  };
  std::vector<Case> cases = {
      {"truncated",
       npy("{'descr': '<f4', 'fortran_order': False, 'shape': (1000,), }", std::string(3996, 'x')),
       "header says 1000 float32 = 4000 bytes, file has 3996 after the header"},
      {"badheader",
       npy("{'descr': '<f4', 'fortran_order': False, 'shape': (10,)", std::string(40, 'x')),
       "not a valid dict literal"},
      {"bigendian",
       npy("{'descr': '>f4', 'fortran_order': False, 'shape': (10,), }", std::string(40, 'x')),
       "big-endian"},
      {"fortran",
       npy("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 5), }", std::string(40, 'x')),
       "Fortran-order"},
      {"badmagic", "\x93NUMPZ garbage", "not a .npy file"},
      {"short", std::string("\x93NUMPY\x01\x00\xff\x00{", 11), "runs past the end of the file"},
  };
  std::string before = Listing();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    WriteFile(L(c.name + ".npy"), c.bytes);
    auto put = Gpufs("put " + L(c.name + ".npy") + " " + P("new/obj/" + c.name));
    EXPECT_NE(put.status, 0);
    EXPECT_NE(put.output.find(c.name + ".npy: "), std::string::npos) << put.output;
    EXPECT_NE(put.output.find(c.message), std::string::npos) << put.output;
    EXPECT_EQ(Listing(), before);
  }
}

// --- import -------------------------------------------------------------------

struct Model {
  std::string file;  // the whole .safetensors
  std::string data;  // its data section
  json header;
};

// Tensors of several dtypes and shapes, a gap, an empty tensor, metadata, and
// one tensor large enough to span read chunks (64 MiB).
Model MakeModel(bool large) {
  Model m;
  uint64_t big = large ? (70ull << 20) : (3ull << 20);
  m.data = RandomBytes(8 + 24 + 16 + 4 + big + 6, 11);
  m.header = {
      {"__metadata__", {{"format", "pt"}, {"source", "cli_e2e_test"}}},
      {"embed.weight", T("BF16", {2, 2}, 0, 8)},
      {"layer.0.w", T("F32", {2, 3}, 8, 32)},
      {"layer.0.b", T("I64", {2}, 32, 48)},
      // 4 bytes of gap at [48, 52)
      {"big", T("U8", {big}, 52, 52 + big)},
      {"flags", T("BOOL", {2, 3}, 52 + big, 58 + big)},
      {"none", T("F16", {0, 4}, 58 + big, 58 + big)},
  };
  m.file = Safetensors(m.header, m.data);
  return m;
}

TEST_F(CliE2E, ImportSafetensors) {
  Model m = MakeModel(/*large=*/true);
  WriteFile(L("model.safetensors"), m.file);
  auto imported = Gpufs("import " + L("model.safetensors") + " " + P("models/tiny"));
  ASSERT_EQ(imported.status, 0) << imported.output;
  EXPECT_EQ(imported.output, "");  // no terminal: no progress bar

  EXPECT_EQ(Xattr(P("models/tiny"), "user.gpufs.type"), "SafeTensors");
  EXPECT_EQ(Xattr(P("models/tiny"), "user.format"), "pt");
  EXPECT_EQ(Xattr(P("models/tiny"), "user.source"), "cli_e2e_test");
  struct Want {
    std::string name, dtype, shape;
  };
  for (const Want& w : std::vector<Want>{{"embed.weight", "bfloat16", "2,2"},
                                         {"layer.0.w", "float32", "2,3"},
                                         {"layer.0.b", "int64", "2"},
                                         {"big", "uint8", std::to_string(70 << 20)},
                                         {"flags", "bool", "2,3"},
                                         {"none", "float16", "0,4"}}) {
    SCOPED_TRACE(w.name);
    std::string path = P("models/tiny/" + w.name);
    EXPECT_EQ(Xattr(path, "user.gpufs.dtype"), w.dtype);
    EXPECT_EQ(Xattr(path, "user.gpufs.shape"), w.shape);
    auto offsets = m.header[w.name]["data_offsets"];
    uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    EXPECT_TRUE(ReadFile(path) == m.data.substr(begin, end - begin)) << "bytes differ";
  }
  // Nothing but the object: no temporary left behind.
  EXPECT_EQ(Sh("LC_ALL=C ls -a " + P("models")).output, ".\n..\ntiny\n");

  auto ls = Gpufs("ls --json " + P("models/tiny"));
  ASSERT_EQ(ls.status, 0) << ls.output;
  json listing = json::parse(ls.output, nullptr, false);
  ASSERT_TRUE(listing.is_array()) << ls.output;
  ASSERT_EQ(listing.size(), 6u);
  EXPECT_EQ(listing[0]["name"], "big");  // sorted
  for (const auto& e : listing) {
    EXPECT_EQ(e["type"], "blob");
    EXPECT_EQ(e["typename"], "Blob");
    EXPECT_EQ(e["device"], "host");
    EXPECT_EQ(e["mode"], "0644");
    if (e["name"] == "layer.0.w") {
      EXPECT_EQ(e["size"], 24);
      EXPECT_EQ(e["dtype"], "float32");
      EXPECT_EQ(e["shape"], json({2, 3}));
    }
  }
  auto parent = json::parse(Gpufs("ls --json " + P("models")).output, nullptr, false);
  ASSERT_TRUE(parent.is_array());
  ASSERT_EQ(parent.size(), 1u);
  EXPECT_EQ(parent[0]["type"], "object");
  EXPECT_EQ(parent[0]["typename"], "SafeTensors");
  EXPECT_TRUE(parent[0]["size"].is_null());
  EXPECT_TRUE(parent[0]["dtype"].is_null());

  auto stat = Gpufs("stat --json " + P("models/tiny"));
  ASSERT_EQ(stat.status, 0) << stat.output;
  json meta = json::parse(stat.output, nullptr, false);
  ASSERT_TRUE(meta.is_object()) << stat.output;
  EXPECT_EQ(meta["typename"], "SafeTensors");
  EXPECT_EQ(meta["fields"]["format"], "pt");
  EXPECT_EQ(meta["members"].size(), 6u);
  EXPECT_EQ(meta["members"]["layer.0.b"]["state"], "sealed");
  auto text = Gpufs("stat " + P("models/tiny"));
  EXPECT_NE(text.output.find("typename: SafeTensors"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("members:  6"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("field:    format=pt"), std::string::npos) << text.output;
}

TEST_F(CliE2E, ImportOntoAnExistingPathIsEexistUnlessReplace) {
  Model m = MakeModel(false);
  WriteFile(L("m.safetensors"), m.file);
  ASSERT_EQ(Gpufs("import " + L("m.safetensors") + " " + P("m")).status, 0);
  std::string before = Listing();
  auto again = Gpufs("import " + L("m.safetensors") + " " + P("m"));
  EXPECT_NE(again.status, 0);
  EXPECT_NE(again.output.find("EEXIST"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("--replace"), std::string::npos) << again.output;
  EXPECT_EQ(Listing(), before);
  // Onto a blob, too.
  WriteFile(P("blob"), "x");
  before = Listing();
  EXPECT_NE(Gpufs("import " + L("m.safetensors") + " " + P("blob")).status, 0);
  EXPECT_EQ(Listing(), before);

  // --replace swaps in the new object and drops the old.
  json small = {{"only", T("U8", {3}, 0, 3)}};
  WriteFile(L("small.safetensors"), Safetensors(small, "abc"));
  auto replaced = Gpufs("import --replace " + L("small.safetensors") + " " + P("m"));
  ASSERT_EQ(replaced.status, 0) << replaced.output;
  EXPECT_EQ(Sh("LC_ALL=C ls -a " + P("m")).output, ".\n..\nonly\n");
  EXPECT_EQ(ReadFile(P("m/only")), "abc");
  EXPECT_EQ(Xattr(P("m"), "user.format"), "<ENODATA>");
  ASSERT_EQ(Gpufs("import --replace " + L("small.safetensors") + " " + P("blob")).status, 0);
  EXPECT_EQ(ReadFile(P("blob/only")), "abc");
  EXPECT_EQ(Sh("LC_ALL=C ls -a " + P("")).output, ".\n..\n.gpufs\nblob\nm\n");
}

TEST_F(CliE2E, MalformedSafetensorsAreRefusedAndCreateNothing) {
  Model m = MakeModel(false);
  json past = m.header;
  past["big"]["data_offsets"][1] = m.data.size() + 100;
  past["big"]["shape"] = {m.data.size() + 100 - 52};
  json unknown = m.header;
  unknown["flags"]["dtype"] = "F4";
  json overlap = m.header;
  overlap["layer.0.b"]["data_offsets"] = {24, 40};
  json mismatch = m.header;
  mismatch["layer.0.w"]["shape"] = {3, 3};
  json bad_name = m.header;
  bad_name["a/b"] = T("U8", {0}, 0, 0);
  struct Case {
    std::string name, bytes, message;
  };
  std::vector<Case> cases = {
      {"truncated", m.file.substr(0, m.file.size() - 1000), "run past the end of the data section"},
      {"tiny", "abc", "less than the 8-byte header length"},
      {"badjson", Le64(6) + "{\"a\":1", "header is not valid JSON"},
      {"notobject", Safetensors(json::array({1, 2}), ""), "not an object"},
      {"hugeheader", Le64(1ull << 40) + "{}", "implausible"},
      {"headerpastend", Le64(4096) + "{}", "runs past the end of the file"},
      {"past", Safetensors(past, m.data), "run past the end of the data section"},
      {"unknown", Safetensors(unknown, m.data), "dtype 'F4', which gpufs does not know"},
      {"overlap", Safetensors(overlap, m.data), "overlap"},
      {"mismatch", Safetensors(mismatch, m.data), "shape [3, 3] of F32 is 36 bytes"},
      {"badname", Safetensors(bad_name, m.data), "contains '/'"},
  };
  ASSERT_EQ(Sh("mkdir " + P("existing")).status, 0);
  std::string before = Listing();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    WriteFile(L(c.name + ".safetensors"), c.bytes);
    for (const std::string& target : {P("model"), P("existing/model"), P("new/deep/model")}) {
      auto r = Gpufs("import " + L(c.name + ".safetensors") + " " + target);
      EXPECT_NE(r.status, 0);
      EXPECT_NE(r.output.find(c.name + ".safetensors: "), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
      EXPECT_EQ(Listing(), before);
    }
  }
  EXPECT_NE(Gpufs("import " + L("none.safetensors") + " " + P("model")).status, 0);
  auto outside = Gpufs("import " + L("truncated.safetensors") + " " + L("not-a-mount/model"));
  EXPECT_NE(outside.status, 0);
  EXPECT_NE(outside.output.find("not on a gpufs mount"), std::string::npos) << outside.output;
  EXPECT_EQ(Listing(), before);
}

// A .npy is put, not imported: the error says so instead of calling its
// header length implausible.
TEST_F(CliE2E, ImportOfANpyNamesPut) {
  WriteFile(L("x.npy"), std::string("\x93NUMPY\x01\x00\x76\x00", 10) + std::string(118, ' '));
  WriteFile(L("renamed"), ReadFile(L("x.npy")));
  std::string before = Listing();
  for (const std::string& file : {L("x.npy"), L("renamed")}) {
    auto r = Gpufs("import " + file + " " + P("m"));
    EXPECT_EQ(r.status, 1);
    EXPECT_NE(r.output.find(file + " is a .npy file; import reads .safetensors files: put it "
                                   "with gpufs put " + file + " " + P("m")),
              std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("implausible"), std::string::npos) << r.output;
  }
  EXPECT_EQ(Listing(), before);
}

TEST(CliImportE2E, FailureMidwayLeavesNothing) {
  // A store too small for the model: the upload fails with ENOSPC part way.
  GpufsMount mount({"--store", "host", "--capacity", "2M"});
  ASSERT_TRUE(mount.Start());
  std::string local = mount.state() + "-local";
  ASSERT_EQ(Sh("mkdir -p " + local).status, 0);
  Model m = MakeModel(false);  // 3 MiB
  WriteFile(local + "/m.safetensors", m.file);
  auto listing = [&] { return Sh("cd " + mount.mnt() + " && find . | sort").output; };
  ASSERT_EQ(Sh("mkdir " + mount.Path("keep")).status, 0);
  std::string before = listing();
  auto r = Sh(GpufsBin() + " import " + local + "/m.safetensors " + mount.Path("a/b/model"));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("ENOSPC"), std::string::npos) << r.output;
  EXPECT_EQ(listing(), before);
  r = Sh(GpufsBin() + " import " + local + "/m.safetensors " + mount.Path("keep/model"));
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(listing(), before);
  // The space comes back: a model that fits imports afterwards.
  json small = {{"x", T("U8", {1 << 20}, 0, 1 << 20)}};
  WriteFile(local + "/s.safetensors", Safetensors(small, RandomBytes(1 << 20, 5)));
  r = Sh(GpufsBin() + " import " + local + "/s.safetensors " + mount.Path("keep/model"));
  EXPECT_EQ(r.status, 0) << r.output;
  Sh("rm -rf " + local);
  EXPECT_TRUE(mount.Stop());
}

// --- stat of an object too large for its attribute ------------------------------

TEST_F(CliE2E, StatJsonOfAnObjectTooLargeForItsAttribute) {
  // ~2000 members: user.gpufs.meta passes 64 KiB (E2BIG); stat builds it instead.
  json header = json::object();
  for (int i = 0; i < 2000; ++i) {
    header["model.layers." + std::to_string(i) + ".self_attn.q_proj.weight"] =
        T("U8", {1}, i, i + 1);
  }
  WriteFile(L("many.safetensors"), Safetensors(header, std::string(2000, 'm')));
  auto imported = Gpufs("import " + L("many.safetensors") + " " + P("many"));
  ASSERT_EQ(imported.status, 0) << imported.output;
  EXPECT_EQ(Xattr(P("many"), "user.gpufs.meta"), "<E2BIG>");
  auto stat = Gpufs("stat --json " + P("many"));
  ASSERT_EQ(stat.status, 0) << stat.output.substr(0, 2000);
  json meta = json::parse(stat.output, nullptr, false);
  ASSERT_TRUE(meta.is_object());
  EXPECT_EQ(meta["typename"], "SafeTensors");
  EXPECT_EQ(meta["members"].size(), 2000u);
  EXPECT_EQ(meta["members"]["model.layers.7.self_attn.q_proj.weight"]["size"], 1);
  EXPECT_EQ(meta["tiers"], json({{"host", 2000}}));
  auto text = Gpufs("stat " + P("many"));
  EXPECT_EQ(text.status, 0) << text.output;
  EXPECT_NE(text.output.find("members:  2000"), std::string::npos) << text.output;
}

}  // namespace
}  // namespace gpufs::e2e
