// Tests for the GGUF reader: images built in memory by tests/common/gguf_builder round-trip
// through GgufFile::from_memory/open, and every kind of broken image (bad header, truncation
// at every byte, bad offsets, types, dims, duplicates, absurd counts) is a one-line error.
// Run under ASan (QEVICT_SANITIZE=ON) to prove that no broken image is read out of bounds.
#include "gguf/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/gguf_builder.h"

namespace qevict {
namespace {

using test::GgufBuilder;
using test::GgufImage;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

Expected<std::shared_ptr<GgufFile>> parse(const std::vector<uint8_t>& bytes,
                                          const std::string& name = "test.gguf") {
  return GgufFile::from_memory(bytes.data(), bytes.size(), name);
}

// A deterministic byte pattern, so that data pointers can be checked by content.
std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 31 + seed);
  return v;
}

// Parsing must fail with one line that starts with the name and contains `substr`.
::testing::AssertionResult fails_with(const std::vector<uint8_t>& bytes,
                                      const std::string& substr) {
  auto r = parse(bytes, "bad.gguf");
  if (r.has_value()) return ::testing::AssertionFailure() << "parsed, expected '" << substr << "'";
  const std::string& msg = r.error();
  if (msg.rfind("bad.gguf: ", 0) != 0)
    return ::testing::AssertionFailure() << "error does not name the file: " << msg;
  if (msg.find('\n') != std::string::npos)
    return ::testing::AssertionFailure() << "error is not one line: " << msg;
  if (msg.find(substr) == std::string::npos)
    return ::testing::AssertionFailure() << "error '" << msg << "' lacks '" << substr << "'";
  return ::testing::AssertionSuccess() << msg;
}

// A file under the gtest temp dir, removed when the object goes away.
class TempFile {
 public:
  explicit TempFile(const std::string& tag) {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = ::testing::TempDir() + "qevict_gguf_" + std::to_string(getpid()) + "_" + info->name() +
            "_" + tag + ".gguf";
  }
  ~TempFile() { std::remove(path_.c_str()); }
  void write(const std::vector<uint8_t>& bytes) const {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// ---------------------------------------------------------------------------------------
// Metadata
// ---------------------------------------------------------------------------------------

TEST(GgufMetadata, EveryScalarTypeRoundTrips) {
  const std::string with_nul("a\0b", 3);
  GgufImage img = GgufBuilder()
                      .add_u8("u8", 255)
                      .add_i8("i8", -128)
                      .add_u16("u16", 65535)
                      .add_i16("i16", -32768)
                      .add_u32("u32", 0xffffffffu)
                      .add_i32("i32", std::numeric_limits<int32_t>::min())
                      .add_u64("u64", kU64Max)
                      .add_i64("i64", std::numeric_limits<int64_t>::min())
                      .add_f32("f32", 1.5f)
                      .add_f64("f64", -2.25e300)
                      .add_bool("true", true)
                      .add_bool("false", false)
                      .add_string("str", "h\xc3\xa9llo world")
                      .add_string("empty", "")
                      .add_string("nul", with_nul)
                      .build();
  auto r = parse(img.bytes);
  ASSERT_TRUE(r.has_value()) << r.error();
  const GgufFile& f = **r;
  EXPECT_EQ(f.metadata().size(), 15u);
  EXPECT_TRUE(f.tensors().empty());

  struct Int {
    const char* key;
    GgufValueType type;
    int64_t value;
  };
  const Int ints[] = {
      {"u8", GgufValueType::kUint8, 255},
      {"i8", GgufValueType::kInt8, -128},
      {"u16", GgufValueType::kUint16, 65535},
      {"i16", GgufValueType::kInt16, -32768},
      {"u32", GgufValueType::kUint32, 0xffffffffll},
      {"i32", GgufValueType::kInt32, std::numeric_limits<int32_t>::min()},
      {"i64", GgufValueType::kInt64, std::numeric_limits<int64_t>::min()},
      {"true", GgufValueType::kBool, 1},
      {"false", GgufValueType::kBool, 0},
  };
  for (const Int& e : ints) {
    SCOPED_TRACE(e.key);
    const GgufValue* v = f.find(e.key);
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->type, e.type);
    EXPECT_TRUE(v->is_integer());
    EXPECT_TRUE(v->is_number());
    auto i = f.get_int(e.key);
    ASSERT_TRUE(i.has_value()) << i.error();
    EXPECT_EQ(*i, e.value);
    EXPECT_EQ(f.get_int_or(e.key, 7), e.value);
    auto d = f.get_float(e.key);
    ASSERT_TRUE(d.has_value()) << d.error();
    EXPECT_EQ(*d, static_cast<double>(e.value));
  }
  // uint64 beyond int64: the exact value is in u, and as_double uses it.
  const GgufValue* u64 = f.find("u64");
  ASSERT_NE(u64, nullptr);
  EXPECT_EQ(u64->type, GgufValueType::kUint64);
  EXPECT_EQ(u64->u, kU64Max);
  EXPECT_EQ(u64->as_double(), 18446744073709551616.0);
  EXPECT_EQ(f.find("u32")->u, 0xffffffffu);

  auto f32 = f.get_float("f32");
  ASSERT_TRUE(f32.has_value());
  EXPECT_EQ(*f32, 1.5);
  EXPECT_EQ(f.find("f32")->type, GgufValueType::kFloat32);
  EXPECT_EQ(f.get_float_or("f64", 0.0), -2.25e300);
  EXPECT_EQ(f.find("f64")->type, GgufValueType::kFloat64);

  auto s = f.get_string("str");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(*s, "h\xc3\xa9llo world");
  EXPECT_EQ(f.get_string_or("empty", "x"), "");
  EXPECT_EQ(f.get_string_or("nul", ""), with_nul);
}

TEST(GgufMetadata, GettersReportMissingAndWrongKinds) {
  GgufImage img = GgufBuilder().add_string("s", "x").add_f32("f", 0.25f).add_i32("i", 3).build();
  auto r = parse(img.bytes, "kinds.gguf");
  ASSERT_TRUE(r.has_value()) << r.error();
  const GgufFile& f = **r;
  EXPECT_EQ(f.find("nope"), nullptr);
  EXPECT_EQ(f.get_int("nope").error(), "kinds.gguf: missing metadata 'nope'");
  EXPECT_EQ(f.get_string("nope").error(), "kinds.gguf: missing metadata 'nope'");
  EXPECT_EQ(f.get_float("nope").error(), "kinds.gguf: missing metadata 'nope'");
  EXPECT_THAT(f.get_int("f").error(), HasSubstr("'f' is not an integer"));
  EXPECT_THAT(f.get_int("s").error(), HasSubstr("'s' is not an integer"));
  EXPECT_THAT(f.get_float("s").error(), HasSubstr("'s' is not a number"));
  EXPECT_THAT(f.get_string("i").error(), HasSubstr("'i' is not a string"));
  EXPECT_EQ(f.get_int_or("f", -1), -1);
  EXPECT_EQ(f.get_int_or("nope", -2), -2);
  EXPECT_EQ(f.get_float_or("s", 9.5), 9.5);
  EXPECT_EQ(f.get_float_or("i", 0.0), 3.0);
  EXPECT_EQ(f.get_string_or("i", "dflt"), "dflt");
}

template <typename T>
void expect_array(const GgufFile& f, const std::string& key, GgufValueType et,
                  const std::vector<T>& want) {
  SCOPED_TRACE(key);
  const GgufValue* v = f.find(key);
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, GgufValueType::kArray);
  EXPECT_EQ(v->arr_type, et);
  ASSERT_EQ(v->arr.size(), want.size());
  for (size_t j = 0; j < want.size(); ++j) {
    EXPECT_EQ(v->arr[j].type, et) << "element " << j;
    if constexpr (std::is_floating_point_v<T>) {
      EXPECT_EQ(v->arr[j].f, static_cast<double>(want[j])) << "element " << j;
    } else if constexpr (std::is_signed_v<T>) {
      EXPECT_EQ(v->arr[j].i, static_cast<int64_t>(want[j])) << "element " << j;
    } else {
      EXPECT_EQ(v->arr[j].u, static_cast<uint64_t>(want[j])) << "element " << j;
    }
  }
  // An array is not a scalar of any kind.
  EXPECT_FALSE(f.get_int(key).has_value());
  EXPECT_FALSE(f.get_float(key).has_value());
  EXPECT_FALSE(f.get_string(key).has_value());
}

TEST(GgufMetadata, ArraysOfEveryElementTypeRoundTrip) {
  using T = GgufValueType;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<uint8_t> u8{0, 7, 255};
  const std::vector<int8_t> i8{-128, 0, 127};
  const std::vector<uint16_t> u16{1, 65535};
  const std::vector<int16_t> i16{-32768, 32767, -1};
  const std::vector<uint32_t> u32{0xffffffffu, 5};
  const std::vector<int32_t> i32{std::numeric_limits<int32_t>::min(), 42};
  const std::vector<uint64_t> u64{0, kU64Max};
  const std::vector<int64_t> i64{std::numeric_limits<int64_t>::min(), -7, 1ll << 50};
  const std::vector<float> f32{0.5f, -1e30f, inf};
  const std::vector<double> f64{3.141592653589793, -0.0, 1e-300};
  const std::vector<uint8_t> bools{1, 0, 1};
  const std::vector<std::string> strs{"a", "", "\xc3\xbc", "with space", std::string(300, 'z')};
  GgufImage img = GgufBuilder()
                      .add_array("a.u8", T::kUint8, u8)
                      .add_array("a.i8", T::kInt8, i8)
                      .add_array("a.u16", T::kUint16, u16)
                      .add_array("a.i16", T::kInt16, i16)
                      .add_array("a.u32", T::kUint32, u32)
                      .add_array("a.i32", T::kInt32, i32)
                      .add_array("a.u64", T::kUint64, u64)
                      .add_array("a.i64", T::kInt64, i64)
                      .add_array("a.f32", T::kFloat32, f32)
                      .add_array("a.f64", T::kFloat64, f64)
                      .add_array("a.bool", T::kBool, bools)
                      .add_string_array("a.str", strs)
                      .add_array("a.empty", T::kUint32, std::vector<uint32_t>{})
                      .add_string_array("a.empty_str", {})
                      .build();
  auto r = parse(img.bytes);
  ASSERT_TRUE(r.has_value()) << r.error();
  const GgufFile& f = **r;
  expect_array(f, "a.u8", T::kUint8, u8);
  expect_array(f, "a.i8", T::kInt8, i8);
  expect_array(f, "a.u16", T::kUint16, u16);
  expect_array(f, "a.i16", T::kInt16, i16);
  expect_array(f, "a.u32", T::kUint32, u32);
  expect_array(f, "a.i32", T::kInt32, i32);
  expect_array(f, "a.u64", T::kUint64, u64);
  expect_array(f, "a.i64", T::kInt64, i64);
  expect_array(f, "a.f32", T::kFloat32, f32);
  expect_array(f, "a.f64", T::kFloat64, f64);
  expect_array(f, "a.bool", T::kBool, bools);
  expect_array(f, "a.empty", T::kUint32, std::vector<uint32_t>{});
  EXPECT_TRUE(std::signbit(f.find("a.f64")->arr[1].f));

  const GgufValue* s = f.find("a.str");
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->arr_type, T::kString);
  ASSERT_EQ(s->arr.size(), strs.size());
  for (size_t j = 0; j < strs.size(); ++j) {
    EXPECT_EQ(s->arr[j].type, T::kString);
    EXPECT_EQ(s->arr[j].s, strs[j]);
  }
  const GgufValue* es = f.find("a.empty_str");
  ASSERT_NE(es, nullptr);
  EXPECT_EQ(es->arr_type, T::kString);
  EXPECT_TRUE(es->arr.empty());
}

TEST(GgufMetadata, DuplicateKeyIsRejected) {
  EXPECT_TRUE(fails_with(GgufBuilder().add_u32("a", 1).add_u32("a", 1).build().bytes,
                         "duplicate metadata key 'a'"));
  EXPECT_TRUE(
      fails_with(GgufBuilder().add_string("k", "x").add_f32("b", 1).add_i8("k", 2).build().bytes,
                 "duplicate metadata key 'k'"));
}

TEST(GgufMetadata, UnknownValueTypeIsRejected) {
  EXPECT_TRUE(fails_with(GgufBuilder().add_raw("k", 13, {0, 0, 0, 0}).build().bytes,
                         "metadata 'k' has unknown value type 13"));
  EXPECT_TRUE(fails_with(GgufBuilder().add_u8("ok", 1).add_raw("k2", 0xffffffffu, {}).build().bytes,
                         "metadata 'k2' has unknown value type 4294967295"));
}

TEST(GgufMetadata, NestedAndUnknownArrayElementTypesAreRejected) {
  // An array whose elements are arrays (each u32 type + u64 count = 0).
  std::vector<uint8_t> inner;
  test::put<uint32_t>(inner, 0);
  test::put<uint64_t>(inner, 0);
  EXPECT_TRUE(fails_with(GgufBuilder().add_raw_array("nested", 9, 1, inner).build().bytes,
                         "array 'nested' has unsupported element type 9"));
  EXPECT_TRUE(fails_with(GgufBuilder().add_raw_array("odd", 13, 1, {1, 2, 3, 4}).build().bytes,
                         "array 'odd' has unsupported element type 13"));
}

TEST(GgufMetadata, HugeArrayAndStringLengthsAreRejected) {
  EXPECT_TRUE(fails_with(GgufBuilder().add_raw_array("big", 0, 1ull << 40, {1, 2, 3}).build().bytes,
                         "array 'big' length 1099511627776 exceeds the file"));
  EXPECT_TRUE(fails_with(GgufBuilder().add_raw_array("big", 10, kU64Max, {}).build().bytes,
                         "array 'big' length 18446744073709551615 exceeds the file"));
  // A count that fits the byte check but not the element size: 40 uint64 in a ~100-byte file.
  EXPECT_TRUE(fails_with(
      GgufBuilder().add_raw_array("u64s", 10, 40, std::vector<uint8_t>(40)).build().bytes,
      "'u64s'"));

  std::vector<uint8_t> huge_len;
  test::put<uint64_t>(huge_len, 1ull << 62);
  EXPECT_TRUE(
      fails_with(GgufBuilder().add_raw("s", 8, huge_len).build().bytes, "truncated metadata 's'"));
  EXPECT_TRUE(fails_with(GgufBuilder().add_raw_array("strs", 8, 1, huge_len).build().bytes,
                         "truncated array 'strs'"));

  // A key whose length field is absurd.
  GgufImage img = GgufBuilder().add_u8("k", 1).build();
  std::vector<uint8_t> bytes = img.bytes;
  const uint64_t absurd = kU64Max - 3;
  std::memcpy(bytes.data() + 24, &absurd, 8);
  EXPECT_TRUE(fails_with(bytes, "truncated metadata key #0"));
}

// ---------------------------------------------------------------------------------------
// Header
// ---------------------------------------------------------------------------------------

TEST(GgufHeader, Versions2And3Parse) {
  for (uint32_t v : {2u, 3u}) {
    SCOPED_TRACE(v);
    GgufImage img = GgufBuilder()
                        .version(v)
                        .add_string("general.architecture", "llama")
                        .add_tensor("w", {8}, GgmlType::kF32, pattern(32, 1))
                        .build();
    auto r = parse(img.bytes);
    ASSERT_TRUE(r.has_value()) << r.error();
    EXPECT_EQ((*r)->version(), v);
    EXPECT_EQ((*r)->get_string_or("general.architecture", ""), "llama");
    ASSERT_EQ((*r)->tensors().size(), 1u);
  }
}

TEST(GgufHeader, EmptyImagesParse) {
  GgufImage img = GgufBuilder().build();
  EXPECT_EQ(img.bytes.size(), 32u);  // 24-byte header padded to the alignment
  auto r = parse(img.bytes);
  ASSERT_TRUE(r.has_value()) << r.error();
  EXPECT_TRUE((*r)->metadata().empty());
  EXPECT_TRUE((*r)->tensors().empty());
  EXPECT_EQ((*r)->alignment(), 32u);
  // The bare 24-byte header is a complete file too: no tensors, so no data section needed.
  auto bare = test::truncated(img.bytes, 24);
  EXPECT_TRUE(parse(bare).has_value());
}

TEST(GgufHeader, BadMagicIsRejected) {
  EXPECT_TRUE(fails_with(GgufBuilder().magic(0).build().bytes, "not a GGUF file (bad magic)"));
  EXPECT_TRUE(fails_with(GgufBuilder().magic(0x47475546).build().bytes, "bad magic"));  // "FUGG"
  EXPECT_TRUE(fails_with(GgufBuilder().magic(0x46554746).build().bytes, "bad magic"));  // "FGUF"
}

TEST(GgufHeader, UnsupportedVersionsAreRejected) {
  for (uint32_t v : {0u, 1u, 4u, 0xffffffffu}) {
    EXPECT_TRUE(fails_with(GgufBuilder().version(v).build().bytes,
                           "unsupported GGUF version " + std::to_string(v) + " (supported: 2, 3)"));
  }
}

TEST(GgufHeader, AbsurdCountsAreRejected) {
  EXPECT_TRUE(fails_with(GgufBuilder().n_kv_override(1ull << 62).build().bytes,
                         "header counts exceed the file size"));
  EXPECT_TRUE(fails_with(GgufBuilder().n_kv_override(kU64Max).build().bytes,
                         "header counts exceed the file size"));
  EXPECT_TRUE(fails_with(GgufBuilder().n_tensors_override(kU64Max).build().bytes,
                         "header counts exceed the file size"));
  EXPECT_TRUE(fails_with(GgufBuilder().n_tensors_override(1ull << 40).build().bytes,
                         "header counts exceed the file size"));
  // Counts that pass the size check but promise more entries than the file holds.
  GgufImage img = GgufBuilder().add_u8("k", 1).n_kv_override(2).pad_end(false).build();
  const size_t end_of_kv = 24 + 8 + 1 + 4 + 1;
  EXPECT_TRUE(fails_with(test::truncated(img.bytes, end_of_kv), "truncated metadata key #1"));
  GgufImage img2 = GgufBuilder().add_u8("k", 1).n_tensors_override(1).build();
  EXPECT_TRUE(fails_with(test::truncated(img2.bytes, end_of_kv), "truncated tensor info #0"));
}

// ---------------------------------------------------------------------------------------
// Tensors and alignment
// ---------------------------------------------------------------------------------------

struct TensorSpec {
  const char* name;
  std::vector<int64_t> dims;
  GgmlType type;
  int64_t n_elements;
  uint64_t n_bytes;  // written out from ggml-common.h block sizes, not from the reader's table
};

const std::vector<TensorSpec>& tensor_specs() {
  static const std::vector<TensorSpec> specs = {
      {"f32.1d", {7}, GgmlType::kF32, 7, 7 * 4},
      {"f16.2d", {6, 3}, GgmlType::kF16, 18, 18 * 2},
      {"q4_0", {64, 2}, GgmlType::kQ4_0, 128, 4 * 18},
      {"q4_1", {32}, GgmlType::kQ4_1, 32, 20},
      {"q8_0.3d", {96, 1, 2}, GgmlType::kQ8_0, 192, 6 * 34},
      {"q4_k", {256, 2}, GgmlType::kQ4_K, 512, 2 * 144},
      {"q6_k", {512}, GgmlType::kQ6_K, 512, 2 * 210},
      {"bf16.4d", {2, 3, 4, 5}, GgmlType::kBF16, 120, 240},
  };
  return specs;
}

GgufBuilder builder_with_specs() {
  GgufBuilder b;
  uint8_t seed = 1;
  for (const TensorSpec& s : tensor_specs())
    b.add_tensor(s.name, s.dims, s.type, pattern(s.n_bytes, seed++));
  return b;
}

void expect_specs(const GgufFile& f, const GgufImage& img) {
  ASSERT_EQ(f.tensors().size(), tensor_specs().size());
  uint8_t seed = 1;
  for (size_t i = 0; i < tensor_specs().size(); ++i) {
    const TensorSpec& s = tensor_specs()[i];
    SCOPED_TRACE(s.name);
    const GgufTensorInfo* t = f.find_tensor(s.name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t, &f.tensors()[i]) << "tensors() keeps file order";
    EXPECT_EQ(t->name, s.name);
    EXPECT_EQ(t->dims, s.dims);
    for (int d = 0; d < 4; ++d)
      EXPECT_EQ(t->ne(d), d < static_cast<int>(s.dims.size()) ? s.dims[d] : 1) << "dim " << d;
    EXPECT_EQ(t->type, s.type);
    EXPECT_EQ(t->n_elements, s.n_elements);
    EXPECT_EQ(t->n_bytes, s.n_bytes);
    EXPECT_EQ(t->offset, img.tensor_offsets[i]);
    EXPECT_EQ(t->offset % f.alignment(), 0u);
    const uint8_t* want = img.bytes.data() + img.data_start + img.tensor_offsets[i];
    EXPECT_EQ(t->data, want);
    const std::vector<uint8_t> content = pattern(s.n_bytes, seed++);
    EXPECT_EQ(std::memcmp(t->data, content.data(), content.size()), 0);
  }
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
}

TEST(GgufTensors, InfosSizesAndDataPointersWithDefaultAlignment) {
  GgufImage img = builder_with_specs().add_string("general.name", "t").build();
  EXPECT_EQ(img.data_start % 32, 0u);
  auto r = parse(img.bytes);
  ASSERT_TRUE(r.has_value()) << r.error();
  EXPECT_EQ((*r)->alignment(), 32u);
  expect_specs(**r, img);
}

TEST(GgufTensors, CustomAlignmentMovesDataOffsets) {
  for (uint32_t a : {1u, 8u, 64u, 4096u}) {
    SCOPED_TRACE(a);
    GgufImage img = builder_with_specs().alignment(a).build();
    auto r = parse(img.bytes);
    ASSERT_TRUE(r.has_value()) << r.error();
    EXPECT_EQ((*r)->alignment(), a);
    EXPECT_EQ(img.data_start % a, 0u);
    expect_specs(**r, img);
  }
  // With 64, the 28-byte first tensor pushes the second to 64, the 36-byte second to 128.
  GgufImage img = builder_with_specs().alignment(64).build();
  EXPECT_EQ(img.tensor_offsets[1], 64u);
  EXPECT_EQ(img.tensor_offsets[2], 128u);
}

TEST(GgufTensors, InvalidAlignmentIsRejected) {
  const char* msg = "general.alignment must be a power of two";
  for (uint32_t a : {0u, 3u, 48u, 131072u})
    EXPECT_TRUE(fails_with(GgufBuilder().add_u32("general.alignment", a).build().bytes, msg)) << a;
  EXPECT_TRUE(fails_with(GgufBuilder().add_i32("general.alignment", -32).build().bytes, msg));
  EXPECT_TRUE(fails_with(GgufBuilder().add_f32("general.alignment", 32.0f).build().bytes, msg));
  EXPECT_TRUE(fails_with(GgufBuilder().add_string("general.alignment", "32").build().bytes, msg));
}

TEST(GgufTensors, OffsetsOutsideTheFileAreRejected) {
  auto one = [](uint64_t offset) {
    return GgufBuilder()
        .add_tensor("w", {8}, GgmlType::kF32, pattern(32, 0))
        .offset_override(offset);
  };
  EXPECT_TRUE(fails_with(one(1 << 20).build().bytes,
                         "tensor 'w' (offset 1048576, 32 bytes) lies outside the file"));
  EXPECT_TRUE(fails_with(one(kU64Max - 31).build().bytes, "lies outside the file"));
  // Offset in range but the data runs past the end.
  GgufImage img = one(0).pad_end(false).build();
  EXPECT_TRUE(parse(img.bytes).has_value());
  EXPECT_TRUE(
      fails_with(test::truncated(img.bytes, img.bytes.size() - 1), "lies outside the file"));
  // The second tensor's data is cut off.
  GgufImage two = GgufBuilder()
                      .add_tensor("a", {8}, GgmlType::kF32, pattern(32, 0))
                      .add_tensor("b", {64}, GgmlType::kF16, pattern(128, 0))
                      .build();
  EXPECT_TRUE(fails_with(test::truncated(two.bytes, two.bytes.size() - 100), "tensor 'b'"));
}

TEST(GgufTensors, UnalignedOffsetIsRejected) {
  auto img = GgufBuilder()
                 .add_tensor("w", {8}, GgmlType::kF32, pattern(32, 0))
                 .offset_override(16)
                 .build();
  EXPECT_TRUE(fails_with(img.bytes, "tensor 'w' offset 16 is not aligned to 32"));
  auto img64 = GgufBuilder()
                   .alignment(64)
                   .add_tensor("a", {8}, GgmlType::kF32, pattern(32, 0))
                   .add_tensor("b", {8}, GgmlType::kF32, pattern(32, 0))
                   .offset_override(32)
                   .build();
  EXPECT_TRUE(fails_with(img64.bytes, "tensor 'b' offset 32 is not aligned to 64"));
}

TEST(GgufTensors, UnknownTypeIdIsRejected) {
  for (uint32_t id : {4u, 5u, 16u, 29u, 99u, 0xffffffffu}) {
    auto img = GgufBuilder().add_tensor("w", {32}, id, pattern(64, 0)).build();
    EXPECT_TRUE(fails_with(img.bytes, "tensor 'w' has unknown type id " + std::to_string(id)));
  }
}

TEST(GgufTensors, DimCountOutside1To4IsRejected) {
  EXPECT_TRUE(
      fails_with(GgufBuilder().add_tensor("s", {}, GgmlType::kF32, pattern(4, 0)).build().bytes,
                 "tensor 's' has 0 dims (1..4 allowed)"));
  EXPECT_TRUE(fails_with(
      GgufBuilder().add_tensor("h", {1, 1, 1, 1, 1}, GgmlType::kF32, pattern(4, 0)).build().bytes,
      "tensor 'h' has 5 dims (1..4 allowed)"));
  std::vector<uint8_t> bytes =
      GgufBuilder().add_tensor("x", {1, 1, 1, 1, 1}, GgmlType::kF32, {}).build().bytes;
  const uint32_t n_dims_huge = 0xffffffffu;
  std::memcpy(bytes.data() + 24 + 8 + 1, &n_dims_huge, 4);  // after the name "x"
  EXPECT_TRUE(fails_with(bytes, "tensor 'x' has 4294967295 dims"));
}

TEST(GgufTensors, InvalidDimensionsAreRejected) {
  auto dims = [](std::vector<int64_t> d) {
    return GgufBuilder()
        .add_tensor("w", std::move(d), GgmlType::kF32, pattern(64, 0))
        .build()
        .bytes;
  };
  EXPECT_TRUE(fails_with(dims({0}), "tensor 'w' has an invalid dimension 0"));
  EXPECT_TRUE(fails_with(dims({4, 0}), "invalid dimension 0"));
  EXPECT_TRUE(fails_with(dims({-1}), "invalid dimension -1"));
  EXPECT_TRUE(fails_with(dims({1ll << 41}), "invalid dimension 2199023255552"));
  // Each dim is fine but the element count overflows int64.
  EXPECT_TRUE(fails_with(dims({1ll << 40, 1ll << 40}), "invalid dimension"));
}

TEST(GgufTensors, ByteSizeOverflowIsRejected) {
  // 2^62 f32 elements: the element count fits int64 but 2^62 * 4 bytes wraps uint64 to 0, which
  // must not pass the bounds check as an empty tensor.
  for (GgmlType t : {GgmlType::kF32, GgmlType::kF64, GgmlType::kI64}) {
    auto img = GgufBuilder().add_tensor("w", {1ll << 40, 1ll << 22}, t, pattern(64, 0)).build();
    EXPECT_TRUE(fails_with(img.bytes, "tensor 'w' (4611686018427387904 elements of "));
    EXPECT_TRUE(fails_with(img.bytes, "is larger than the file"));
  }
  // Sizes that fit the file size but not the bytes after the offset.
  auto img = GgufBuilder().add_tensor("w", {8, 2}, GgmlType::kF32, pattern(64, 0)).build();
  EXPECT_TRUE(parse(img.bytes).has_value());
  auto big = GgufBuilder().add_tensor("w", {8, 2}, GgmlType::kF32, pattern(32, 0)).build();
  EXPECT_TRUE(fails_with(big.bytes, "tensor 'w' (offset 0, 64 bytes) lies outside the file"));
}

TEST(GgufTensors, RowLengthMustBeAMultipleOfTheBlockSize) {
  auto img = GgufBuilder().add_tensor("q", {33, 2}, GgmlType::kQ8_0, pattern(136, 0)).build();
  EXPECT_TRUE(fails_with(img.bytes,
                         "tensor 'q': row length 33 is not a multiple of the q8_0 block size 32"));
  auto imgk = GgufBuilder().add_tensor("k", {128}, GgmlType::kQ4_K, pattern(144, 0)).build();
  EXPECT_TRUE(
      fails_with(imgk.bytes, "row length 128 is not a multiple of the q4_k block size 256"));
  // Only the row (ne[0]) is blocked: other dims may be anything.
  auto ok = GgufBuilder().add_tensor("q", {32, 3}, GgmlType::kQ8_0, pattern(3 * 34, 0)).build();
  EXPECT_TRUE(parse(ok.bytes).has_value());
}

TEST(GgufTensors, DuplicateTensorNameIsRejected) {
  auto img = GgufBuilder()
                 .add_tensor("w", {8}, GgmlType::kF32, pattern(32, 0))
                 .add_tensor("v", {8}, GgmlType::kF32, pattern(32, 0))
                 .add_tensor("w", {4}, GgmlType::kF16, pattern(8, 0))
                 .build();
  EXPECT_TRUE(fails_with(img.bytes, "duplicate tensor 'w'"));
}

// ---------------------------------------------------------------------------------------
// Truncation: every prefix of a small valid file must be an error, never a crash (ASan).
// ---------------------------------------------------------------------------------------

TEST(GgufTruncation, EveryPrefixIsRejected) {
  GgufImage img = GgufBuilder()
                      .version(3)
                      .add_string("general.architecture", "llama")
                      .add_u32("llama.block_count", 2)
                      .add_f32("eps", 1e-5f)
                      .add_bool("flag", true)
                      .add_array("scores", GgufValueType::kFloat32, std::vector<float>{1, 2, 3})
                      .add_string_array("tokens", {"<s>", "a", "bc"})
                      .alignment(16)
                      .add_tensor("q", {32, 2}, GgmlType::kQ8_0, pattern(68, 3))
                      .add_tensor("f", {8}, GgmlType::kF32, pattern(32, 4))
                      .pad_end(false)  // so that the last data byte is the last byte
                      .build();
  ASSERT_TRUE(parse(img.bytes).has_value());
  size_t n_truncated = 0, n_magic = 0, n_counts = 0;
  for (size_t len = 0; len < img.bytes.size(); ++len) {
    // An exact-size heap copy, so that ASan catches a read one byte past the prefix.
    std::unique_ptr<uint8_t[]> buf(new uint8_t[len == 0 ? 1 : len]);
    std::memcpy(buf.get(), img.bytes.data(), len);
    auto r = GgufFile::from_memory(buf.get(), len, "cut.gguf");
    ASSERT_FALSE(r.has_value()) << "prefix of " << len << " bytes parsed";
    const std::string& msg = r.error();
    ASSERT_THAT(msg, StartsWith("cut.gguf: ")) << len;
    ASSERT_EQ(msg.find('\n'), std::string::npos) << msg;
    if (msg.find("truncated") != std::string::npos) {
      ++n_truncated;
    } else if (msg.find("bad magic") != std::string::npos) {
      ++n_magic;  // fewer than 4 bytes
    } else if (msg.find("header counts exceed") != std::string::npos ||
               msg.find("exceeds the file") != std::string::npos) {
      ++n_counts;  // too short to hold the promised entries
    } else {
      ADD_FAILURE() << "prefix " << len << ": unexpected message: " << msg;
    }
  }
  EXPECT_EQ(n_magic, 4u);
  EXPECT_GT(n_truncated, img.bytes.size() / 2);
  EXPECT_EQ(n_magic + n_counts + n_truncated, img.bytes.size());
}

// ---------------------------------------------------------------------------------------
// GgufFile::open
// ---------------------------------------------------------------------------------------

TEST(GgufOpen, NonexistentPath) {
  const std::string path = ::testing::TempDir() + "qevict_definitely_missing_dir/none.gguf";
  auto r = GgufFile::open(path);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), path + ": cannot open: No such file or directory");
}

TEST(GgufOpen, DirectoryIsNotAFile) {
  auto r = GgufFile::open(::testing::TempDir());
  ASSERT_FALSE(r.has_value());
  EXPECT_THAT(r.error(), HasSubstr(": not a regular file"));
}

TEST(GgufOpen, EmptyAndTinyFiles) {
  TempFile empty("empty");
  empty.write({});
  auto r = GgufFile::open(empty.path());
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error(), empty.path() + ": file too small to be GGUF (0 bytes)");

  TempFile tiny("tiny");
  tiny.write(test::truncated(GgufBuilder().build().bytes, 23));
  auto t = GgufFile::open(tiny.path());
  ASSERT_FALSE(t.has_value());
  EXPECT_THAT(t.error(), HasSubstr("file too small to be GGUF (23 bytes)"));
}

TEST(GgufOpen, WrittenFileRoundTripsThroughTheMapping) {
  GgufImage img =
      builder_with_specs().alignment(64).add_string("general.architecture", "x").build();
  TempFile file("valid");
  file.write(img.bytes);
  auto r = GgufFile::open(file.path());
  ASSERT_TRUE(r.has_value()) << r.error();
  std::shared_ptr<GgufFile> f = *r;
  EXPECT_EQ(f->path(), file.path());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->get_string_or("general.architecture", ""), "x");
  ASSERT_EQ(f->tensors().size(), tensor_specs().size());
  // Same content as the image, at the same file offsets (the pointers are into the mapping).
  for (size_t i = 0; i < tensor_specs().size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    const uint8_t* want = img.bytes.data() + img.data_start + img.tensor_offsets[i];
    EXPECT_EQ(std::memcmp(t.data, want, t.n_bytes), 0) << t.name;
  }
}

TEST(GgufOpen, TruncatedFileOnDiskIsRejected) {
  GgufImage img = builder_with_specs().build();
  TempFile file("cut");
  file.write(test::truncated(img.bytes, img.bytes.size() - 200));
  auto r = GgufFile::open(file.path());
  ASSERT_FALSE(r.has_value());
  EXPECT_THAT(r.error(), StartsWith(file.path() + ": "));
  EXPECT_THAT(r.error(), HasSubstr("lies outside the file"));
}

// ---------------------------------------------------------------------------------------
// The real model (QEVICT_TEST_MODEL), when present.
// ---------------------------------------------------------------------------------------

TEST(GgufRealModel, SmolLM2Opens) {
  const char* path = std::getenv("QEVICT_TEST_MODEL");
  if (path == nullptr || *path == '\0') GTEST_SKIP() << "QEVICT_TEST_MODEL is not set";
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.has_value()) << r.error();
  const GgufFile& f = **r;
  EXPECT_EQ(f.get_string_or("general.architecture", ""), "llama");
  EXPECT_EQ(f.get_int_or("llama.block_count", 0), 30);
  const GgufTensorInfo* emb = f.find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(emb->n_bytes, 576ull * 49152 / 32 * 34);
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->arr_type, GgufValueType::kString);
  EXPECT_EQ(tokens->arr.size(), 49152u);
  EXPECT_TRUE(f.get_string("tokenizer.chat_template").has_value());
  // 30 blocks of 9 tensors, plus token_embd and output_norm (the output is tied).
  EXPECT_EQ(f.tensors().size(), 30u * 9 + 2);
}

}  // namespace
}  // namespace qevict
