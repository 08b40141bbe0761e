// GGUF reader/writer: real files parse, written files round-trip, and every kind of
// malformed file ends in one kiln::Error that names the file and the field.
#include <gtest/gtest.h>

#include <cstring>

#include "kiln/gguf.h"
#include "test_util.h"

using namespace kiln;
using namespace kiln::gguf;

namespace {

std::string write_bytes(const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = test::temp_dir() + "/" + name;
  test::write_file(path, std::string(bytes.begin(), bytes.end()));
  return path;
}

// Expects File::open to throw kiln::Error whose message contains every fragment.
void expect_error(const std::string& path, std::initializer_list<std::string> fragments) {
  try {
    File::open(path);
    FAIL() << "no error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "missing '" << f << "' in: " << msg;
  }
}

std::vector<uint8_t> f32_bytes(std::vector<float> v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

Writer small_writer() {
  Writer w;
  w.set("general.architecture", Value::of_string("llama"));
  w.set("test.u32", Value::of_u32(7));
  w.add_tensor("a.weight", TensorType::F32, {4, 2}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  w.add_tensor("b.weight", TensorType::F32, {3}, f32_bytes({9, 10, 11}));
  return w;
}

// Offsets of fields inside small_writer()'s bytes, found by searching for the names.
size_t find_bytes(const std::vector<uint8_t>& hay, const std::string& needle) {
  auto it = std::search(hay.begin(), hay.end(), needle.begin(), needle.end());
  return (size_t)(it - hay.begin());
}

template <typename T>
void poke(std::vector<uint8_t>& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

}  // namespace

TEST(Gguf, ReadsStories260K) {
  auto f = File::open(test::shared_path("models/stories260K.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(f->get_uint("llama.block_count"), 5u);
  EXPECT_EQ(f->get_uint("llama.attention.head_count"), 8u);
  EXPECT_EQ(f->get_uint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens").size(), 512u);
  const TensorInfo* emb = f->find_tensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->dims, (std::vector<uint64_t>{64, 512}));
  EXPECT_EQ(emb->type, TensorType::F32);
  EXPECT_EQ(emb->n_bytes, 64u * 512u * 4u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(emb->data) % f->alignment(), 0u);
  // A wrong-type request names the key and the types.
  try {
    f->get_string("llama.block_count");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'llama.block_count' is uint32, expected string"), std::string::npos) << e.what();
  }
}

TEST(Gguf, WriterRoundTripsEveryValueType) {
  Writer w;
  Value u8; u8.type = ValueType::UINT8; u8.u = 250;
  Value i8; i8.type = ValueType::INT8; i8.i = -100;
  Value u16; u16.type = ValueType::UINT16; u16.u = 65000;
  Value i16; i16.type = ValueType::INT16; i16.i = -30000;
  Value i64; i64.type = ValueType::INT64; i64.i = -(int64_t(1) << 40);
  Value f64; f64.type = ValueType::FLOAT64; f64.f = 0.1;
  w.set("k.u8", u8);
  w.set("k.i8", i8);
  w.set("k.u16", u16);
  w.set("k.i16", i16);
  w.set("k.u32", Value::of_u32(4000000000u));
  w.set("k.i32", Value::of_i32(-5));
  w.set("k.u64", Value::of_u64(uint64_t(1) << 60));
  w.set("k.i64", i64);
  w.set("k.f32", Value::of_f32(1.5f));
  w.set("k.f64", f64);
  w.set("k.bool", Value::of_bool(true));
  w.set("k.str", Value::of_string("héllo"));
  w.set("k.strs", Value::of_array(ValueType::STRING, {Value::of_string("a"), Value::of_string(""), Value::of_string("ccc")}));
  w.set("k.nested", Value::of_array(ValueType::ARRAY, {Value::of_array(ValueType::INT32, {Value::of_i32(1), Value::of_i32(-2)}),
                                                       Value::of_array(ValueType::INT32, {})}));
  w.set_alignment(64);
  std::vector<uint8_t> f16(6 * 2, 0x3c);
  w.add_tensor("t.f16", TensorType::F16, {6}, f16);
  w.add_tensor("t.f32", TensorType::F32, {2, 3}, f32_bytes({1, 2, 3, 4, 5, 6}));
  const std::string path = test::temp_dir() + "/roundtrip.gguf";
  w.write(path);
  const std::vector<uint8_t> bytes = w.to_bytes();
  EXPECT_TRUE(test::read_file(path) == std::string(bytes.begin(), bytes.end())) << "write() and to_bytes() differ";

  auto f = File::open(path);
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->find("k.u8")->u, 250u);
  EXPECT_EQ(f->find("k.i8")->i, -100);
  EXPECT_EQ(f->find("k.u16")->u, 65000u);
  EXPECT_EQ(f->find("k.i16")->i, -30000);
  EXPECT_EQ(f->get_uint("k.u32"), 4000000000u);
  EXPECT_EQ(f->get_int("k.i32", 0), -5);
  EXPECT_EQ(f->get_uint("k.u64"), uint64_t(1) << 60);
  EXPECT_EQ(f->get_int("k.i64", 0), -(int64_t(1) << 40));
  EXPECT_FLOAT_EQ((float)f->get_float("k.f32"), 1.5f);
  EXPECT_DOUBLE_EQ(f->get_float("k.f64"), 0.1);
  EXPECT_TRUE(f->get_bool("k.bool", false));
  EXPECT_EQ(f->get_string("k.str"), "héllo");
  EXPECT_EQ(f->get_string_array("k.strs"), (std::vector<std::string>{"a", "", "ccc"}));
  const Value* nested = f->find("k.nested");
  ASSERT_EQ(nested->size(), 2u);
  EXPECT_EQ(nested->at(0).at(1).i, -2);
  EXPECT_EQ(nested->at(1).size(), 0u);
  EXPECT_EQ(f->find("k.strs")->at(2).s, "ccc");
  const TensorInfo* t = f->find_tensor("t.f32");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->rows(), 3u);
  EXPECT_EQ(t->row_bytes(), 8u);
  float got[6];
  std::memcpy(got, t->data, sizeof got);
  EXPECT_EQ(got[5], 6.0f);
  EXPECT_EQ((size_t)(f->find_tensor("t.f16")->data - f->find_tensor("t.f32")->data) % 64, 0u);
  EXPECT_EQ(f->get_uint("missing", 9), 9u);
  EXPECT_THROW(f->get_uint("missing"), Error);
}

TEST(Gguf, EveryTruncationIsAnErrorNotACrash) {
  const std::vector<uint8_t> good = small_writer().to_bytes();
  auto f = File::open(write_bytes("good.gguf", good));
  // Past the last tensor's data only alignment padding follows; cutting it loses nothing.
  const TensorInfo& last = f->tensors().back();
  const size_t end_of_data = f->data_offset() + last.offset + last.n_bytes;
  ASSERT_LT(end_of_data, good.size());
  f.reset();
  for (size_t len = 0; len < end_of_data; ++len) {
    const std::string path = write_bytes("trunc.gguf", std::vector<uint8_t>(good.begin(), good.begin() + len));
    EXPECT_THROW(File::open(path), Error) << "prefix of " << len << " bytes";
  }
}

TEST(Gguf, BadHeaders) {
  std::vector<uint8_t> bytes = small_writer().to_bytes();
  auto bad = bytes;
  bad[0] = 'X';
  expect_error(write_bytes("magic.gguf", bad), {"bad magic"});
  bad = bytes;
  poke<uint32_t>(bad, 4, 1);
  expect_error(write_bytes("v1.gguf", bad), {"version 1"});
  bad = bytes;
  poke<uint32_t>(bad, 4, 99);
  expect_error(write_bytes("v99.gguf", bad), {"version 99"});
  bad = bytes;
  poke<uint64_t>(bad, 8, uint64_t(1) << 62);
  expect_error(write_bytes("ntensors.gguf", bad), {"tensor count"});
  bad = bytes;
  poke<uint64_t>(bad, 16, ~uint64_t(0));
  expect_error(write_bytes("nkv.gguf", bad), {"metadata count"});
  expect_error(test::temp_dir() + "/does-not-exist.gguf", {"cannot open"});
  expect_error(write_bytes("empty.gguf", {}), {"too small"});
}

TEST(Gguf, HostileMetadata) {
  std::vector<uint8_t> bytes = small_writer().to_bytes();
  // The key "test.u32" is preceded by its u64 length; make the length absurd.
  const size_t key_at = find_bytes(bytes, "test.u32");
  auto bad = bytes;
  poke<uint64_t>(bad, key_at - 8, uint64_t(1) << 50);
  expect_error(write_bytes("keylen.gguf", bad), {"metadata key #1", "truncated"});
  // Unknown value type right after the key.
  bad = bytes;
  poke<uint32_t>(bad, key_at + 8, 77);
  expect_error(write_bytes("vtype.gguf", bad), {"'test.u32'", "unknown value type 77"});

  Writer w;
  w.set("arr", Value::of_array(ValueType::UINT32, {Value::of_u32(1)}));
  auto arr = w.to_bytes();
  const size_t arr_at = find_bytes(arr, "arr") + 3 + 4 + 4;  // key, type ARRAY, element type
  poke<uint64_t>(arr, arr_at, uint64_t(1) << 61);
  expect_error(write_bytes("arrcount.gguf", arr), {"'arr'", "cannot fit"});

  Value deep = Value::of_array(ValueType::INT32, {});
  for (int i = 0; i < 12; ++i) deep = Value::of_array(ValueType::ARRAY, {deep});
  Writer wd;
  wd.set("deep", deep);
  expect_error(write_bytes("deep.gguf", wd.to_bytes()), {"'deep'", "nested deeper"});

  Writer wb;
  wb.set("flag", Value::of_bool(true));
  auto b = wb.to_bytes();
  b[find_bytes(b, "flag") + 4 + 4] = 7;
  expect_error(write_bytes("bool.gguf", b), {"'flag'", "bool value 7"});

  Writer wa = small_writer();
  wa.set("general.alignment", Value::of_u32(24));
  expect_error(write_bytes("align.gguf", wa.to_bytes()), {"general.alignment 24", "power of two"});

  // Duplicate keys: write two keys and rename the second onto the first.
  Writer wk;
  wk.set("dup.aa", Value::of_u32(1));
  wk.set("dup.ab", Value::of_u32(2));
  auto dk = wk.to_bytes();
  dk[find_bytes(dk, "dup.ab") + 5] = 'a';
  expect_error(write_bytes("dupkey.gguf", dk), {"'dup.aa' appears twice"});
}

TEST(Gguf, HostileTensorInfos) {
  const std::vector<uint8_t> bytes = small_writer().to_bytes();
  // Tensor info layout after the name: n_dims u32, dims u64..., type u32, offset u64.
  const size_t info_at = find_bytes(bytes, "b.weight") + 8;  // "b.weight" has 1 dim
  auto bad = bytes;
  poke<uint32_t>(bad, info_at, 5);
  expect_error(write_bytes("ndims.gguf", bad), {"tensor 'b.weight'", "5 dimensions"});
  bad = bytes;
  poke<uint64_t>(bad, info_at + 4, uint64_t(1) << 62);
  expect_error(write_bytes("dim.gguf", bad), {"tensor 'b.weight'", "absurd"});
  bad = bytes;
  poke<uint64_t>(bad, info_at + 4, 0);
  expect_error(write_bytes("zerodim.gguf", bad), {"tensor 'b.weight'", "dimension 0 is 0"});
  bad = bytes;
  poke<uint32_t>(bad, info_at + 12, 1234);
  expect_error(write_bytes("ttype.gguf", bad), {"tensor 'b.weight'", "unknown tensor type 1234"});
  bad = bytes;
  poke<uint32_t>(bad, info_at + 12, static_cast<uint32_t>(TensorType::Q4_0));
  expect_error(write_bytes("block.gguf", bad), {"tensor 'b.weight'", "block size 32"});
  bad = bytes;
  poke<uint64_t>(bad, info_at + 16, 4096);
  expect_error(write_bytes("offset.gguf", bad), {"tensor 'b.weight' data [offset 4096", "lies past end of file"});
  bad = bytes;
  poke<uint64_t>(bad, info_at + 16, 33);
  expect_error(write_bytes("misaligned.gguf", bad), {"tensor 'b.weight'", "not a multiple of the alignment"});
  bad = bytes;
  poke<uint64_t>(bad, info_at + 16, ~uint64_t(0) - 31);  // aligned, and overflows when added
  expect_error(write_bytes("overflow.gguf", bad), {"tensor 'b.weight'", "past end of file"});

  // Two dims whose product overflows 64 bits.
  const size_t a_info = find_bytes(bytes, "a.weight") + 8;
  bad = bytes;
  poke<uint64_t>(bad, a_info + 4, uint64_t(1) << 39);
  poke<uint64_t>(bad, a_info + 12, uint64_t(1) << 39);
  expect_error(write_bytes("product.gguf", bad), {"tensor 'a.weight'", "too many elements"});

  Writer dup = small_writer();
  dup.add_tensor("a.weight", TensorType::F32, {1}, f32_bytes({1}));
  expect_error(write_bytes("duptensor.gguf", dup.to_bytes()), {"tensor 'a.weight' appears twice"});
}
