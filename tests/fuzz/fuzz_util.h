#pragma once
// Shared by the fuzz targets: inputs become files (the readers under test take paths),
// and the shared data directory is found as the tests find it.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace kiln::fuzz {

// The input as a file in memory (memfd): no disk traffic per execution, and a path that
// open() and mmap() treat like any regular file.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(memfd_create("kiln-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += size_t(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

inline std::string shared_dir() {
  if (const char* env = std::getenv("KILN_SHARED_DIR")) return env;
  return KILN_SHARED_DIR;
}

}  // namespace kiln::fuzz
