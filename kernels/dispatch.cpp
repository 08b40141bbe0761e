// Chooses the kernel table once per process from what the CPU and OS both support.
#include <cstdlib>
#include <string>

#include "kernels/tables.h"
#include "kiln/error.h"

#ifdef KILN_HAVE_X86
#include <cpuid.h>

#include <cstring>

#include "kernels/x86/avx512bf16/gemm_bf16.h"
#include "kernels/x86/prefetch.h"
#endif

namespace kiln::kernels {
namespace {

#ifdef KILN_HAVE_X86
uint64_t xgetbv0() {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}

struct CpuFeatures {
  bool avx2 = false;     // AVX2 + FMA + F16C, YMM state enabled by the OS
  bool avxvnni = false;  // + AVX-VNNI (CPUID 7.1 EAX bit 4; VEX-encoded, YMM state only)
  bool avx512 = false;   // F/BW/VL/DQ/VNNI, ZMM + opmask state enabled by the OS
  bool avx512bf16 = false;  // + AVX512-BF16 (CPUID 7.1 EAX bit 5)
};

// cpuid + xgetbv rather than trusting the CPU alone: a kernel or hypervisor may leave
// the wide register state disabled, and then the instructions fault.
CpuFeatures detect() {
  CpuFeatures f;
  uint32_t a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28), fma = c & (1u << 12),
             f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = xgetbv0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;     // SSE + AVX
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;   // + opmask, ZMM hi256, hi16 ZMM
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid_count(7, 0, a, b, c, d);
  const uint32_t max_subleaf = a;
  const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17),
             avx512bw = b & (1u << 30), avx512vl = b & (1u << 31), vnni = c & (1u << 11);
  f.avx2 = ymm_state && avx2 && fma && f16c;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avxvnni = f.avx2 && (a & (1u << 4));
  }
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512dq && avx512bw && avx512vl && vnni;
  if (max_subleaf >= 1) {
    __cpuid_count(7, 1, a, b, c, d);
    f.avx512bf16 = f.avx512 && (a & (1u << 5));
  }
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

bool amd_cpu() {
  uint32_t a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return false;
  char vendor[12];
  std::memcpy(vendor, &b, 4);
  std::memcpy(vendor + 4, &d, 4);
  std::memcpy(vendor + 8, &c, 4);
  return std::memcmp(vendor, "AuthenticAMD", 12) == 0;
}

// How decode streams packed weights (kernels/x86/prefetch.h). Intel: one group at a time,
// each line asked 1 KiB ahead into L1 and 4 KiB into L2. AMD (Zen 5): those prefetches
// cost bandwidth; four groups at once, each record's lines 2 KiB ahead into L1, read the
// most (1.1B Q4_0 tg 69.3 -> 77.1 tok/s against one group without prefetch; 8 groups or
// 1 or 3-4 KiB ahead no better). KILN_PREFETCH=NEAR,FAR[,GROUPS,AHEAD] (bytes, 0 = off;
// GROUPS 1 to 4) overrides them, to tune another machine.
constexpr x86::StreamPrefetch kIntelStreams{1024, 4096};

x86::StreamPrefetch stream_prefetch_for_cpu() {
  x86::StreamPrefetch d = kIntelStreams;
  if (amd_cpu()) d = {0, 0, 4, 2048};
  const char* env = std::getenv("KILN_PREFETCH");
  if (!env || !*env) return d;
  const auto bad = [&] {
    return Error(std::string("KILN_PREFETCH=") + env + ": expected NEAR,FAR or NEAR,FAR,GROUPS,AHEAD (bytes; GROUPS 1 to 4)");
  };
  unsigned long v[4] = {0, 0, 1, 0};
  const char* at = env;
  int n = 0;
  for (; n < 4; ++n) {
    char* rest = nullptr;
    v[n] = std::strtoul(at, &rest, 10);
    if (rest == at || (*rest && *rest != ',')) throw bad();
    if (!*rest) break;
    at = rest + 1;
  }
  if ((n != 1 && n != 3) || v[2] < 1 || v[2] > 4) throw bad();
  return {v[0], v[1], int(v[2]), v[3]};
}

// Chosen before main (no thread can be reading it yet); a bad KILN_PREFETCH is kept and
// thrown by the first ops(), where errors are reported.
std::string g_prefetch_error;
x86::StreamPrefetch initial_stream_prefetch() {
  try {
    return stream_prefetch_for_cpu();
  } catch (const Error& e) {
    g_prefetch_error = e.what();
    return kIntelStreams;
  }
}
#endif

const Ops& choose() {
#ifdef KILN_HAVE_X86
  if (!g_prefetch_error.empty()) throw Error(g_prefetch_error);
#endif
  const char* forced = std::getenv("KILN_ISA");
  if (forced && *forced) {
    const std::string want = forced;
    for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avxvnni, Isa::avx512}) {
      if (want != isa_name(isa)) continue;
      if (const Ops* table = ops_for(isa)) return *table;
      throw Error("KILN_ISA=" + want + ": this CPU (or this build) does not support " + want);
    }
    throw Error("KILN_ISA=" + want + ": unknown ISA (expected scalar, avx2, avxvnni or avx512)");
  }
  const std::vector<Isa> isas = available_isas();
  return *ops_for(isas.back());
}

}  // namespace

#ifdef KILN_HAVE_X86
x86::StreamPrefetch x86::g_stream_prefetch = initial_stream_prefetch();
#endif
#ifdef KILN_HAVE_AVX512BF16
bool avx512bf16::g_enabled = [] {
  const char* env = std::getenv("KILN_BF16_DOT");
  return features().avx512bf16 && !(env && std::string(env) == "0");
}();
#endif

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avxvnni: return "avxvnni";
    case Isa::avx512: return "avx512";
  }
  return "unknown";
}

const Ops* ops_for(Isa isa) {
  switch (isa) {
    case Isa::scalar: return &scalar_ops();
#ifdef KILN_HAVE_X86
    case Isa::avx2: return features().avx2 ? &avx2_ops() : nullptr;
#ifdef KILN_HAVE_AVXVNNI
    case Isa::avxvnni: return features().avxvnni ? &avxvnni_ops() : nullptr;
#else
    case Isa::avxvnni: return nullptr;  // the compiler could not build it
#endif
    case Isa::avx512: return features().avx512 ? &avx512_ops() : nullptr;
#else
    default: return nullptr;
#endif
  }
  return nullptr;
}

std::vector<Isa> available_isas() {
  std::vector<Isa> isas{Isa::scalar};
  for (Isa isa : {Isa::avx2, Isa::avxvnni, Isa::avx512})
    if (ops_for(isa)) isas.push_back(isa);
  return isas;
}

// A function-local static: initialized once, thread-safe, and a throw (bad KILN_ISA)
// propagates to the caller and is retried on the next call rather than cached.
const Ops& ops() {
  static const Ops& table = choose();
  return table;
}

}  // namespace kiln::kernels
