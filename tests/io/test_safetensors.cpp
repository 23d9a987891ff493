// Tests for io/safetensors.h and io/json_file.h: round trips, sharded model directories, and one test
// per kind of malformed file, each of which must raise lt::Error naming the file and what is wrong.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "testing/error_testing.h"

namespace lt {
namespace {

using testing::expect_error;

namespace fs = std::filesystem;
using nlohmann::json;

// Runs f, expects lt::Error, and checks that its message contains every needle.
// A safetensors file image from a header text and a data area; `len` overrides the length field.
std::string raw_file(const std::string& header, const std::string& data, std::optional<uint64_t> len = {}) {
  uint64_t n = len.value_or(header.size());
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char(uint8_t(n >> (8 * i)));
  return out + header + data;
}

// Bytes of `n` distinct, non-zero values, so a misplaced range cannot compare equal by accident.
std::vector<uint8_t> pattern_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n);
  for (auto& x : b) x = uint8_t(rng() % 255 + 1);
  return b;
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* t = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("lt_st_") + std::to_string(::getpid()) + "_" + t->test_suite_name() + "_" + t->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Writes a raw image and returns its path.
  std::string put(const std::string& bytes, const std::string& name = "bad.safetensors") const {
    std::ofstream(path(name), std::ios::binary) << bytes;
    return path(name);
  }
  // Writes a file whose header is `header` and data area `data_bytes` bytes, and expects open() to fail
  // with a message naming the file and each needle.
  void expect_bad_header(const std::string& header, size_t data_bytes, std::initializer_list<std::string> needles) {
    std::string p = put(raw_file(header, std::string(data_bytes, '\x11')));
    EXPECT_THROW(SafetensorsFile::open(p), Error);
    expect_error([&] { SafetensorsFile::open(p); }, {p});
    expect_error([&] { SafetensorsFile::open(p); }, needles);
  }

  fs::path dir_;
};

// ---- round trips --------------------------------------------------------------------------------------

struct Owned {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
  TensorView view() { return TensorView::contiguous(bytes.data(), dtype, shape); }
};

std::map<std::string, Owned> sample_tensors() {
  std::map<std::string, Owned> m;
  auto add = [&](const std::string& name, DType t, Shape s) {
    size_t n = size_t(shape_numel(s)) * dtype_size(t);
    m[name] = Owned{t, s, pattern_bytes(n, uint32_t(m.size() + 1))};
  };
  add("model.embed_tokens.weight", DType::bf16, {7, 3});  // 42 bytes: odd number of 2-byte pairs
  add("b.f32", DType::f32, {3, 5});
  add("a.f16", DType::f16, {2, 3, 1});
  add("c.i32", DType::i32, {5});
  add("scalar", DType::f32, {});          // 0-d: one element
  add("z.u8", DType::u8, {3});            // 3 bytes: would misalign whatever follows it
  add("i64", DType::i64, {2});
  add("empty", DType::f32, {0, 4});       // no bytes at all
  add("A.upper", DType::i8, {1, 1, 1});
  return m;
}

NamedTensors views_of(std::map<std::string, Owned>& m) {
  NamedTensors out;
  for (auto& [name, o] : m) out[name] = o.view();
  return out;
}

TEST_F(Safetensors, RoundTripKeepsDtypesShapesAndBytes) {
  auto tensors = sample_tensors();
  write_safetensors(path("m.safetensors"), views_of(tensors));
  SafetensorsFile f = SafetensorsFile::open(path("m.safetensors"));

  std::vector<std::string> expected_names;
  for (const auto& kv : tensors) expected_names.push_back(kv.first);
  EXPECT_EQ(f.names(), expected_names);  // sorted (std::map order)
  EXPECT_EQ(f.data_start() % 8, 0u);
  for (auto& [name, o] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(f.contains(name));
    TensorView v = f.view(name);
    EXPECT_EQ(v.dtype, o.dtype);
    EXPECT_EQ(v.shape, o.shape);
    EXPECT_TRUE(v.is_contiguous());
    ASSERT_EQ(v.bytes(), o.bytes.size());
    if (v.bytes() > 0) {
      EXPECT_EQ(std::memcmp(v.data, o.bytes.data(), v.bytes()), 0);
    }
    // Each tensor starts aligned to its dtype size, so the view can be used as a typed pointer.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % dtype_size(v.dtype), 0u);
  }
  EXPECT_EQ(f.view("scalar").numel(), 1);
  EXPECT_EQ(f.view("empty").bytes(), 0u);
}

TEST_F(Safetensors, HeaderIsSortedPaddedAndCarriesFormatPt) {
  auto tensors = sample_tensors();
  write_safetensors(path("m.safetensors"), views_of(tensors), {{"step", "12"}, {"note", "hello"}});
  std::string bytes = read_file(path("m.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | uint8_t(bytes[i]);
  ASSERT_EQ((8 + n) % 8, 0u);  // data area 8-byte aligned in the file
  std::string header = bytes.substr(8, n);
  size_t json_end = header.find_last_not_of(' ') + 1;
  EXPECT_EQ(header.substr(json_end), std::string(n - json_end, ' '));  // padding is spaces only
  EXPECT_EQ(header.find('\n'), std::string::npos);

  // Tensor names appear in sorted order in the header text.
  size_t last = 0;
  for (const auto& kv : tensors) {
    size_t at = header.find("\"" + kv.first + "\":");
    ASSERT_NE(at, std::string::npos) << kv.first;
    EXPECT_GT(at, last) << kv.first;
    last = at;
  }
  json h = json::parse(header);
  EXPECT_EQ(h["__metadata__"]["format"], "pt");

  SafetensorsFile f = SafetensorsFile::open(path("m.safetensors"));
  SafetensorsMetadata want = {{"format", "pt"}, {"note", "hello"}, {"step", "12"}};
  EXPECT_EQ(f.metadata(), want);
}

TEST_F(Safetensors, EmptyTensorSetRoundTrips) {
  write_safetensors(path("e.safetensors"), {});
  SafetensorsFile f = SafetensorsFile::open(path("e.safetensors"));
  EXPECT_TRUE(f.names().empty());
  EXPECT_EQ(f.metadata().at("format"), "pt");
}

TEST_F(Safetensors, ReadF32ConvertsFloatTypesAndChecksShape) {
  std::vector<float> src = {1.0f, -2.5f, 0.15625f, 3e-3f, 65504.0f, -0.0f};
  std::vector<uint16_t> bf(src.size()), hf(src.size());
  convert_f32_to_bf16(bf.data(), src.data(), src.size());
  convert_f32_to_f16(hf.data(), src.data(), src.size());
  std::vector<int32_t> ints = {1, 2};
  write_safetensors(path("m.safetensors"), {{"f32", TensorView::contiguous(src.data(), DType::f32, {2, 3})},
                                            {"bf16", TensorView::contiguous(bf.data(), DType::bf16, {2, 3})},
                                            {"f16", TensorView::contiguous(hf.data(), DType::f16, {2, 3})},
                                            {"ints", TensorView::contiguous(ints.data(), DType::i32, {2})}});
  SafetensorsFile f = SafetensorsFile::open(path("m.safetensors"));
  std::vector<float> out(6);
  f.read_f32("f32", out.data(), {2, 3});
  EXPECT_EQ(out, src);
  f.read_f32("bf16", out.data(), {2, 3});
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(out[i], bf16_to_f32(bf[i])) << i;
  f.read_f32("f16", out.data(), {2, 3});
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(out[i], f16_to_f32(hf[i])) << i;

  std::string p = path("m.safetensors");
  expect_error([&] { f.read_f32("bf16", out.data(), {3, 2}); }, {p, "'bf16'", "[2, 3]", "expected [3, 2]"});
  expect_error([&] { f.read_f32("ints", out.data(), {2}); }, {p, "'ints'", "I32", "floating"});
  expect_error([&] { f.read_f32("nope", out.data(), {2}); }, {p, "'nope'"});
}

TEST_F(Safetensors, UnalignedDataFromForeignWriterStillReads) {
  // An unpadded header of odd length puts the data area at an odd file offset.
  std::string header = R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  if ((8 + header.size()) % 4 == 0) header += " ";
  std::vector<float> vals = {1.5f, -7.25f, 1e20f};
  std::string data(reinterpret_cast<const char*>(vals.data()), 12);
  SafetensorsFile f = SafetensorsFile::open(put(raw_file(header, data), "odd.safetensors"));
  std::vector<float> out(3);
  f.read_f32("x", out.data(), {3});
  EXPECT_EQ(out, vals);
}

TEST_F(Safetensors, ReadF32RangeWritesOnlyItsElements) {
  // A data-parallel rank loads its shard of a tensor: elements [b, e) land at dst[b, e), the rest stay as they
  // were; bf16 and an unaligned f32 source (the bounce-buffer path); a range outside the tensor names both.
  std::vector<float> src(1000);
  for (size_t i = 0; i < src.size(); ++i) src[i] = 0.25f * float(i) - 99.0f;
  std::vector<uint16_t> bf(src.size());
  convert_f32_to_bf16(bf.data(), src.data(), src.size());
  write_safetensors(path("r.safetensors"), {{"bf16", TensorView::contiguous(bf.data(), DType::bf16, {10, 100})}});
  SafetensorsFile f = SafetensorsFile::open(path("r.safetensors"));
  for (const ElementRange r : {ElementRange{0, 1000}, ElementRange{137, 601}, ElementRange{999, 1000},
                               ElementRange{500, 500}, ElementRange{333, -1}}) {
    std::vector<float> out(1000, -1.0f);
    f.read_f32("bf16", out.data(), {10, 100}, r);
    const int64_t end = r.end < 0 ? 1000 : r.end;
    for (int64_t i = 0; i < 1000; ++i)
      EXPECT_EQ(out[size_t(i)], i >= r.begin && i < end ? bf16_to_f32(bf[size_t(i)]) : -1.0f) << i;
  }
  std::string header = R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,20]}})";
  if ((8 + header.size()) % 4 == 0) header += " ";
  SafetensorsFile odd = SafetensorsFile::open(
      put(raw_file(header, std::string(reinterpret_cast<const char*>(src.data()), 20)), "odd.safetensors"));
  std::vector<float> out(5, -1.0f);
  odd.read_f32("x", out.data(), {5}, ElementRange{1, 4});
  EXPECT_EQ(out, (std::vector<float>{-1.0f, src[1], src[2], src[3], -1.0f}));
  const std::string p = path("r.safetensors");
  expect_error([&] { f.read_f32("bf16", out.data(), {10, 100}, ElementRange{900, 1001}); },
               {p, "'bf16'", "[900, 1001)", "1000"});
}

TEST_F(Safetensors, ViewsSurviveMoveAndMissingNameIsReported) {
  auto tensors = sample_tensors();
  write_safetensors(path("m.safetensors"), views_of(tensors));
  SafetensorsFile a = SafetensorsFile::open(path("m.safetensors"));
  TensorView v = a.view("b.f32");
  SafetensorsFile b = std::move(a);  // the mapping moves; the view stays valid
  EXPECT_EQ(std::memcmp(v.data, tensors["b.f32"].bytes.data(), v.bytes()), 0);
  expect_error([&] { b.view("model.norm.weight"); }, {path("m.safetensors"), "'model.norm.weight'"});
}

TEST_F(Safetensors, AtomicWriteReplacesAndLeavesNoTemporary) {
  auto tensors = sample_tensors();
  write_safetensors(path("m.safetensors"), views_of(tensors));
  std::vector<float> one = {4.0f};
  write_safetensors(path("m.safetensors"), {{"only", TensorView::contiguous(one.data(), DType::f32, {1})}});
  EXPECT_EQ(SafetensorsFile::open(path("m.safetensors")).names(), std::vector<std::string>{"only"});
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST_F(Safetensors, WriteErrorNamesPathAndReason) {
  std::string p = path("no/such/dir/m.safetensors");
  expect_error([&] { write_safetensors(p, {}); }, {p, "No such file or directory"});
}

TEST_F(Safetensors, WriterRefusesNonContiguousTensor) {
  std::vector<float> buf(6);
  TensorView t = TensorView::contiguous(buf.data(), DType::f32, {2, 3});
  std::swap(t.strides[0], t.strides[1]);  // a transposed view
  std::swap(t.shape[0], t.shape[1]);
  expect_error([&] { write_safetensors(path("m.safetensors"), {{"t", t}}); }, {"'t'", "not contiguous"});
}

// ---- malformed files: one test per kind ---------------------------------------------------------------

TEST_F(Safetensors, RejectsFileShorterThanLengthField) {
  std::string p = put(std::string("\x05\0\0\0\0", 5));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "5 bytes", "too short"});
  std::string empty = put("", "empty.safetensors");
  expect_error([&] { SafetensorsFile::open(empty); }, {empty, "0 bytes"});
}

TEST_F(Safetensors, RejectsZeroHeaderLength) {
  std::string p = put(raw_file("", "abcd"));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "header length is 0"});
}

TEST_F(Safetensors, RejectsHeaderLengthBeyondFile) {
  std::string p = put(raw_file("{}", "", 1000));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "header length 1000", "exceeds the 2 bytes"});
}

TEST_F(Safetensors, RejectsHeaderLengthOverCap) {
  std::string p = put(raw_file("{}", "", uint64_t(1) << 40));
  expect_error([&] { SafetensorsFile::open(p); }, {p, "cap"});
}

TEST_F(Safetensors, RejectsHeaderThatIsNotJson) {
  expect_bad_header("{\"a\": {\"dtype\": \"F32\",\n  oops}}", 0, {"invalid JSON", "line 2"});
}

TEST_F(Safetensors, RejectsHeaderThatIsNotAnObject) {
  expect_bad_header("[1, 2, 3]", 0, {"header is a JSON array", "expected an object"});
}

TEST_F(Safetensors, RejectsEntryMissingAField) {
  expect_bad_header(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4, {"'w'", "no 'dtype'"});
  expect_bad_header(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4, {"'w'", "no 'shape'"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1]}})", 4, {"'w'", "no 'data_offsets'"});
}

TEST_F(Safetensors, RejectsFieldsOfWrongJsonType) {
  expect_bad_header(R"({"w":[1,2]})", 0, {"'w'", "expected an object"});
  expect_bad_header(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", 4, {"'w'", "'dtype'", "string"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4, {"'w'", "'shape'", "array"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, {"'w'", "'shape'", "1.5"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, {"'w'", "'data_offsets'"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4,
                    {"'w'", "'data_offsets'", "non-negative"});
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4, {"'w'", "begin after end"});
}

TEST_F(Safetensors, RejectsUnknownDtype) {
  expect_bad_header(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", 8, {"'w'", "unknown dtype 'F64'"});
  // Our own lower-case names are not safetensors spellings.
  expect_bad_header(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", 4, {"'w'", "unknown dtype 'f32'"});
}

TEST_F(Safetensors, RejectsNegativeDimension) {
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})", 8,
                    {"'w'", "negative dimension -1"});
}

TEST_F(Safetensors, RejectsShapeThatDisagreesWithByteRange) {
  expect_bad_header(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", 8,
                    {"'w'", "[2, 3]", "needs 12 bytes", "span 8 bytes"});
  // A shape whose byte count overflows must not wrap around to a small, plausible size.
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0,
                    {"'w'", "overflows"});
}

TEST_F(Safetensors, RejectsRangeOutsideDataArea) {
  expect_bad_header(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8,
                    {"'w'", "[0, 16)", "outside the data area of 8 bytes"});
}

TEST_F(Safetensors, RejectsTruncatedFile) {
  std::vector<float> vals(16, 1.0f);
  write_safetensors(path("m.safetensors"), {{"w", TensorView::contiguous(vals.data(), DType::f32, {16})}});
  fs::resize_file(path("m.safetensors"), fs::file_size(path("m.safetensors")) - 4);
  expect_error([&] { SafetensorsFile::open(path("m.safetensors")); },
               {path("m.safetensors"), "'w'", "outside the data area"});
}

TEST_F(Safetensors, RejectsOverlappingRanges) {
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    12, {"'b'", "overlap", "'a'"});
}

TEST_F(Safetensors, RejectsHoleBetweenTensors) {
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                    12, {"hole", "[4, 8)", "'b'"});
}

TEST_F(Safetensors, RejectsBytesAfterLastTensor) {
  expect_bad_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8, {"hole", "[4, 8)", "after"});
}

TEST_F(Safetensors, RejectsNonStringMetadata) {
  expect_bad_header(R"({"__metadata__":{"format":"pt","step":3}})", 0, {"'__metadata__'", "'step'", "string"});
  expect_bad_header(R"({"__metadata__":["pt"]})", 0, {"'__metadata__'", "object"});
}

// Every truncation of a valid file and random byte flips in its header must end in a clean lt::Error
// (or, for a harmless flip, a successful open) — never a crash or another exception type.
TEST_F(Safetensors, CorruptionNeverCrashes) {
  auto tensors = sample_tensors();
  write_safetensors(path("m.safetensors"), views_of(tensors));
  std::string good = read_file(path("m.safetensors"));
  for (size_t len = 0; len < good.size(); ++len) {
    std::string p = put(good.substr(0, len));
    EXPECT_THROW(SafetensorsFile::open(p), Error) << "truncated to " << len;
  }
  size_t header_end = 8;
  for (int i = 7; i >= 0; --i) header_end += size_t(uint8_t(good[i])) << (8 * i);
  for (uint32_t seed = 0; seed < 300; ++seed) {
    std::mt19937 rng(seed);
    std::string bad = good;
    for (int k = 0; k < 3; ++k) bad[rng() % header_end] = char(rng() % 256);
    std::string p = put(bad);
    try {
      SafetensorsFile::open(p);
    } catch (const Error&) {
    } catch (...) {
      ADD_FAILURE() << "seed " << seed << ": an exception other than lt::Error";
    }
  }
}

// ---- model directories --------------------------------------------------------------------------------

TEST_F(Safetensors, ShardedRoundTripWithIndex) {
  auto tensors = sample_tensors();
  NamedTensors views = views_of(tensors);
  size_t total = 0;
  for (const auto& kv : views) total += kv.second.bytes();
  const size_t max_shard = 64;
  std::vector<std::string> written = write_safetensors_model(dir_.string(), views, max_shard);

  ASSERT_GE(written.size(), 3u);  // at least two shards + the index
  size_t n = written.size() - 1;
  EXPECT_EQ(written.back(), kSafetensorsIndexName);
  for (size_t i = 0; i < n; ++i) EXPECT_EQ(written[i], safetensors_shard_name(i, n));
  EXPECT_EQ(safetensors_shard_name(0, 3), "model-00001-of-00003.safetensors");
  EXPECT_FALSE(fs::exists(path(kSafetensorsSingleName)));

  json index = read_json_file(path(kSafetensorsIndexName));
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), views.size());
  for (size_t i = 0; i < n; ++i) {
    SafetensorsFile shard = SafetensorsFile::open(path(written[i]));
    size_t bytes = 0;
    for (const auto& name : shard.names()) {
      bytes += shard.view(name).bytes();
      EXPECT_EQ(index["weight_map"][name], written[i]) << name;
    }
    EXPECT_TRUE(bytes <= max_shard || shard.names().size() == 1) << written[i] << " holds " << bytes;
  }

  SafetensorsModel m = SafetensorsModel::open_dir(dir_.string());
  EXPECT_EQ(m.num_files(), n);
  std::vector<std::string> names;
  for (const auto& kv : views) names.push_back(kv.first);
  EXPECT_EQ(m.names(), names);
  for (auto& [name, o] : tensors) {
    ASSERT_TRUE(m.contains(name));
    TensorView v = m.view(name);
    EXPECT_EQ(v.shape, o.shape);
    if (!o.bytes.empty()) {
      EXPECT_EQ(std::memcmp(v.data, o.bytes.data(), o.bytes.size()), 0) << name;
    }
  }
  std::vector<float> out(15);
  m.read_f32("b.f32", out.data(), {3, 5});
  expect_error([&] { m.view("lm_head.weight"); }, {dir_.string(), "'lm_head.weight'"});
}

TEST_F(Safetensors, TensorLargerThanShardGetsItsOwnShard) {
  std::vector<float> big(100), small(2);
  NamedTensors views = {{"a", TensorView::contiguous(small.data(), DType::f32, {2})},
                        {"b", TensorView::contiguous(big.data(), DType::f32, {100})},
                        {"c", TensorView::contiguous(small.data(), DType::f32, {2})}};
  std::vector<std::string> written = write_safetensors_model(dir_.string(), views, 16);
  ASSERT_EQ(written.size(), 4u);  // [a] [b] [c] + index
  EXPECT_EQ(SafetensorsFile::open(path(written[1])).names(), std::vector<std::string>{"b"});
  EXPECT_EQ(SafetensorsModel::open_dir(dir_.string()).names(), (std::vector<std::string>{"a", "b", "c"}));
}

TEST_F(Safetensors, SingleFileWhenItFitsReplacesStaleIndex) {
  auto tensors = sample_tensors();
  write_safetensors_model(dir_.string(), views_of(tensors), 64);
  ASSERT_TRUE(fs::exists(path(kSafetensorsIndexName)));
  std::vector<std::string> written = write_safetensors_model(dir_.string(), views_of(tensors), size_t(1) << 30);
  EXPECT_EQ(written, std::vector<std::string>{kSafetensorsSingleName});
  EXPECT_FALSE(fs::exists(path(kSafetensorsIndexName)));
  SafetensorsModel m = SafetensorsModel::open_dir(dir_.string());
  EXPECT_EQ(m.num_files(), 1u);
  EXPECT_EQ(m.names().size(), tensors.size());
}

class ShardedError : public Safetensors {
 protected:
  // Two shards: s1 holds a, b; s2 holds c.
  void SetUp() override {
    Safetensors::SetUp();
    vals_.assign(4, 1.0f);
    auto t = TensorView::contiguous(vals_.data(), DType::f32, {4});
    write_safetensors(path("s1.safetensors"), {{"a", t}, {"b", t}});
    write_safetensors(path("s2.safetensors"), {{"c", t}});
  }
  void write_index(const json& weight_map) {
    write_json_file(path(kSafetensorsIndexName), {{"metadata", {{"total_size", 48}}}, {"weight_map", weight_map}});
  }
  std::vector<float> vals_;
};

TEST_F(ShardedError, AcceptsConsistentIndex) {
  write_index({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}});
  SafetensorsModel m = SafetensorsModel::open_dir(dir_.string());
  EXPECT_EQ(m.file_of("c").path(), path("s2.safetensors"));
}

TEST_F(ShardedError, RejectsMissingShardFile) {
  write_index({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s9.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); }, {"'c'", "s9.safetensors", "does not exist"});
}

TEST_F(ShardedError, RejectsTensorMissingFromItsShard) {
  write_index({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s1.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); },
               {kSafetensorsIndexName, "'c'", "s1.safetensors", "does not contain it"});
}

TEST_F(ShardedError, RejectsTensorInTwoShards) {
  auto t = TensorView::contiguous(vals_.data(), DType::f32, {4});
  write_safetensors(path("s2.safetensors"), {{"a", t}, {"c", t}});
  write_index({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); }, {"'a'", "two shards", "s1", "s2"});
}

TEST_F(ShardedError, RejectsShardTensorTheIndexDoesNotList) {
  write_index({{"a", "s1.safetensors"}, {"c", "s2.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); }, {"s1.safetensors", "'b'", "does not list"});
}

TEST_F(ShardedError, RejectsMalformedIndex) {
  write_json_file(path(kSafetensorsIndexName), {{"metadata", {{"total_size", 48}}}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); }, {kSafetensorsIndexName, "'weight_map'"});
  write_index({{"a", 3}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); }, {"'a'", "file name"});
  write_index({{"a", "../s1.safetensors"}});
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); }, {"'a'", "same directory"});
}

TEST_F(Safetensors, RejectsDirectoryWithoutWeights) {
  expect_error([&] { SafetensorsModel::open_dir(dir_.string()); },
               {dir_.string(), kSafetensorsSingleName, kSafetensorsIndexName});
}

// ---- json_file ----------------------------------------------------------------------------------------

TEST_F(Safetensors, JsonParseErrorNamesSourceLineAndColumn) {
  expect_error([] { parse_json("{\n  \"a\": 1,\n  \"b\": tru\n}", "cfg.json"); },
               {"cfg.json", "invalid JSON", "line 3", "column"});
}

TEST_F(Safetensors, ReadFileErrorNamesPathAndReason) {
  std::string p = path("missing.json");
  expect_error([&] { read_file(p); }, {p, "No such file or directory"});
  expect_error([&] { read_json_file(p); }, {p});
}

TEST_F(Safetensors, AtomicJsonWriteRoundTrips) {
  json j = {{"x", 1}, {"y", {1.5, "two"}}};
  write_json_file(path("a.json"), j);
  EXPECT_EQ(read_json_file(path("a.json")), j);
}

}  // namespace
}  // namespace lt
