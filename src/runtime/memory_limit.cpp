// Memory limits for sizing decisions made before allocating (runtime/memory_limit.h).
#include "runtime/memory_limit.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace kiln {

std::string human_bytes(double b) {
  char s[32];
  if (b >= double(1 << 30)) std::snprintf(s, sizeof s, "%.1f GiB", b / double(1 << 30));
  else std::snprintf(s, sizeof s, "%.0f MiB", std::ceil(b / double(1 << 20)));
  return s;
}

MemoryLimit memory_limit() {
  MemoryLimit m{double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)), "this machine's memory"};
  const auto lower = [&](double bytes, const char* what) {
    if (bytes > 0 && (m.bytes <= 0 || bytes < m.bytes)) m = {bytes, what};
  };
  struct rlimit rl {};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    // What is mapped already (the model file, thread stacks, libraries) counts against it.
    double in_use = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      unsigned long pages = 0;
      if (std::fscanf(f, "%lu", &pages) == 1) in_use = double(pages) * double(sysconf(_SC_PAGESIZE));
      std::fclose(f);
    }
    lower(std::max(1.0, double(rl.rlim_cur) - in_use), "what the address-space limit, ulimit -v, leaves");
  }
  if (getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    lower(double(rl.rlim_cur), "the data-size limit, ulimit -d");
  // cgroup v2: the group named in /proc/self/cgroup ("0::/path").
  std::string group;
  if (FILE* f = std::fopen("/proc/self/cgroup", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f))
      if (std::strncmp(line, "0::", 3) == 0) group.assign(line + 3, std::strcspn(line + 3, "\n"));
    std::fclose(f);
  }
  for (const std::string& path : {"/sys/fs/cgroup" + group + "/memory.max", std::string("/sys/fs/cgroup/memory.max")}) {
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      double bytes = 0;
      if (std::fscanf(f, "%lf", &bytes) == 1) lower(bytes, "the container's limit, cgroup memory.max");
      std::fclose(f);
      break;
    }
  }
  return m;
}

}  // namespace kiln
