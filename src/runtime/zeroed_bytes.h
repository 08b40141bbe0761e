#pragma once
// A byte buffer whose pages the kernel zeroes on first touch. A KV cache is sized for the
// whole context but a session usually fills a fraction of it: std::vector would write
// every byte at construction (46 MB and ~11k page faults for a 2048-token f16 cache of a
// 1.1B model before the first token; 740 MB at -c 32768), this costs nothing until used.
#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

namespace kiln {

class ZeroedBytes {
 public:
  ZeroedBytes() = default;
  explicit ZeroedBytes(size_t n) { resize(n); }
  ZeroedBytes(const ZeroedBytes&) = delete;
  ZeroedBytes& operator=(const ZeroedBytes&) = delete;
  ZeroedBytes(ZeroedBytes&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ZeroedBytes& operator=(ZeroedBytes&& o) noexcept {
    std::swap(data_, o.data_), std::swap(size_, o.size_);
    return *this;
  }
  ~ZeroedBytes() { release(); }

  // Discards the contents: n zero bytes afterwards.
  void resize(size_t n) {
    release();
    if (n == 0) return;
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p), size_ = n;
    // Transparent huge pages where the system offers them on request: decoding at a long
    // depth reads every layer's keys and values once per token, and with 4 KiB pages
    // that is a TLB miss every 15 q8_0 keys of a head. Only a hint; failure changes nothing.
#ifdef MADV_HUGEPAGE
    if (n >= kHugePage) madvise(p, n, MADV_HUGEPAGE);
#endif
  }
  static constexpr size_t kHugePage = size_t{2} << 20;

  size_t size() const { return size_; }
  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  uint8_t* begin() { return data_; }
  const uint8_t* begin() const { return data_; }
  uint8_t& operator[](size_t i) { return data_[i]; }
  const uint8_t& operator[](size_t i) const { return data_[i]; }

 private:
  void release() {
    if (data_) munmap(data_, size_);
    data_ = nullptr, size_ = 0;
  }
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kiln
