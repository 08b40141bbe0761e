#pragma once
// XXH64 (the 64-bit xxHash by Yann Collet), written out so kiln needs no library for it:
// model identities (Model::identity) and session-file checksums. Streaming: any split of
// the input into update() calls gives the same digest as XXH64(input, seed) in one piece
// (tests/session_file_test.cpp checks it against the reference library's vectors). It
// reads ~8 bytes per multiply in four independent lanes, so checksumming a large KV cache
// costs far less than writing it.
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace kiln {

static_assert(std::endian::native == std::endian::little, "kiln's file formats are little-endian");

class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0) : seed_(seed) {
    acc_[0] = seed + kP1 + kP2;
    acc_[1] = seed + kP2;
    acc_[2] = seed;
    acc_[3] = seed - kP1;
  }

  void update(const void* data, size_t n) {
    const uint8_t* p = static_cast<const uint8_t*>(data);
    total_ += n;
    if (n < 32 && buffered_ + n < 32) {  // n < 32 first: lets GCC drop this for big constant n
      if (n) std::memcpy(buf_ + buffered_, p, n);
      buffered_ += n;
      return;
    }
    if (buffered_) {
      const size_t take = 32 - buffered_;
      std::memcpy(buf_ + buffered_, p, take);
      stripe(buf_);
      p += take, n -= take, buffered_ = 0;
    }
    // Lanes in locals: stores through uint8_t pointers may alias members, which would
    // otherwise keep the accumulators in memory (4x slower).
    uint64_t a0 = acc_[0], a1 = acc_[1], a2 = acc_[2], a3 = acc_[3];
    for (; n >= 32; p += 32, n -= 32) {
      a0 = round(a0, load<uint64_t>(p));
      a1 = round(a1, load<uint64_t>(p + 8));
      a2 = round(a2, load<uint64_t>(p + 16));
      a3 = round(a3, load<uint64_t>(p + 24));
    }
    acc_[0] = a0, acc_[1] = a1, acc_[2] = a2, acc_[3] = a3;
    if (n) std::memcpy(buf_, p, n);
    buffered_ = n;
  }
  // Fixed-width and length-prefixed fields, so that ("ab","c") and ("a","bc") differ.
  void u64(uint64_t v) { update(&v, sizeof v); }
  void str(std::string_view s) {
    u64(s.size());
    update(s.data(), s.size());
  }

  uint64_t digest() const {
    uint64_t h;
    if (total_ >= 32) {
      h = std::rotl(acc_[0], 1) + std::rotl(acc_[1], 7) + std::rotl(acc_[2], 12) + std::rotl(acc_[3], 18);
      for (uint64_t a : acc_) h = (h ^ round(0, a)) * kP1 + kP4;
    } else {
      h = seed_ + kP5;
    }
    h += total_;
    const uint8_t* p = buf_;
    size_t n = buffered_;
    for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round(0, load<uint64_t>(p)), 27) * kP1 + kP4;
    if (n >= 4) {
      h = std::rotl(h ^ (uint64_t(load<uint32_t>(p)) * kP1), 23) * kP2 + kP3;
      p += 4, n -= 4;
    }
    for (; n; ++p, --n) h = std::rotl(h ^ (uint64_t(*p) * kP5), 11) * kP1;
    h ^= h >> 33;
    h *= kP2;
    h ^= h >> 29;
    h *= kP3;
    h ^= h >> 32;
    return h;
  }

  static uint64_t of(const void* data, size_t n, uint64_t seed = 0) {
    Hash64 h(seed);
    h.update(data, n);
    return h.digest();
  }

 private:
  static constexpr uint64_t kP1 = 0x9E3779B185EBCA87ull, kP2 = 0xC2B2AE3D27D4EB4Full, kP3 = 0x165667B19E3779F9ull,
                            kP4 = 0x85EBCA77C2B2AE63ull, kP5 = 0x27D4EB2F165667C5ull;
  template <typename T>
  static T load(const uint8_t* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static uint64_t round(uint64_t acc, uint64_t input) { return std::rotl(acc + input * kP2, 31) * kP1; }
  void stripe(const uint8_t* p) {
    for (int i = 0; i < 4; ++i) acc_[i] = round(acc_[i], load<uint64_t>(p + 8 * i));
  }

  uint64_t seed_;
  uint64_t acc_[4];
  uint64_t total_ = 0;
  uint8_t buf_[32];
  size_t buffered_ = 0;
};

}  // namespace kiln
