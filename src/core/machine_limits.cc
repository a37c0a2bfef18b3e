#include "core/machine_limits.h"

#if defined(__AVX2__) || defined(__AVX512F__)
#include "core/x86_intrin.h"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace kvcache {

float read_sum(const float* p, int64_t n) {
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  alignas(32) float t[8];
  _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
#else
  float s[8] = {};
  for (int64_t i = 0; i < n; ++i) s[i % 8] += p[i];
  return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
#endif
}

float fma_chains(int64_t n) {
  // Each chain multiplies by m < 1 and adds c: the values stay finite and normal however long
  // it runs (no denormal slow path, no overflow).
#if defined(__AVX512F__)
  __m512 a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = _mm512_set1_ps(1.0f + 0.1f * static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 10
    for (int i = 0; i < kFmaChains; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 s = a[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
#elif defined(__AVX2__) && defined(__FMA__)
  __m256 a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = _mm256_set1_ps(1.0f + 0.1f * static_cast<float>(i));
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 10
    for (int i = 0; i < kFmaChains; ++i) a[i] = _mm256_fmadd_ps(a[i], m, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < kFmaChains; ++i) s = _mm256_add_ps(s, a[i]);
  alignas(32) float t[8];
  _mm256_store_ps(t, s);
  return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
#else
  float a[kFmaChains];
  for (int i = 0; i < kFmaChains; ++i) a[i] = 1.0f + 0.1f * static_cast<float>(i);
  for (int64_t k = 0; k < n; ++k)
    for (float& x : a) x = std::fma(x, 0.999999f, 1e-7f);
  float s = 0;
  for (float x : a) s += x;
  return s;
#endif
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "unknown" : line.substr(start);
  }
  return "unknown";
}

int64_t last_level_cache_bytes() {
  int64_t best = 0;
  std::error_code ec;
  const std::filesystem::path dir("/sys/devices/system/cpu/cpu0/cache");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::ifstream in(entry.path() / "size");
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    // "32K", "1024K", "32768K", "64M": sysfs' shared_cpu_map-free size string.
    int64_t scale = 1;
    const char unit = text.back();
    if (unit == 'K') scale = int64_t{1} << 10;
    if (unit == 'M') scale = int64_t{1} << 20;
    if (unit == 'G') scale = int64_t{1} << 30;
    if (scale > 1) text.pop_back();
    char* end = nullptr;
    const long long v = std::strtoll(text.c_str(), &end, 10);
    if (end == text.c_str() || *end != '\0' || v <= 0) continue;
    best = std::max<int64_t>(best, static_cast<int64_t>(v) * scale);
  }
  return best;
}

int64_t default_read_buffer_bytes(int64_t llc_bytes) {
  // 8x the LLC so that at most an eighth of a pass can come from cache; 256 MiB at least, for
  // hosts whose VM hides its caches (the LLCs of current servers are 32-512 MiB); 2 GiB at most,
  // to keep the probe under a second of allocation and passes.
  constexpr int64_t kMinBytes = int64_t{256} << 20, kMaxBytes = int64_t{2} << 30;
  const int64_t bytes = std::clamp(8 * std::max<int64_t>(llc_bytes, 0), kMinBytes, kMaxBytes);
  return bytes - bytes % 128;
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

}  // namespace

MachineLimits probe_machine_limits(ThreadPool& pool, const MachineProbeOptions& o) {
  if (o.read_repetitions <= 0 || o.fma_repetitions <= 0 || o.fma_iterations <= 0)
    throw Error(ErrorKind::kInvalidArgument,
                "machine probe: repetitions and FMA iterations must be positive");
  MachineLimits r;
  r.n_threads = pool.n_threads();
  r.cpu_model = cpu_model_name();
  r.llc_bytes = last_level_cache_bytes();
  int64_t bytes = o.read_bytes > 0 ? o.read_bytes : default_read_buffer_bytes(r.llc_bytes);
  bytes -= bytes % 128;  // whole 32-float steps
  if (bytes < 128)
    throw Error(ErrorKind::kInvalidArgument,
                "machine probe: a read buffer of " + std::to_string(o.read_bytes) +
                    " bytes is too small; give at least 128 (0: sized from the cache)");
  r.read_buffer_bytes = bytes;
  const int64_t n = bytes / static_cast<int64_t>(sizeof(float));
  std::unique_ptr<float, FreeDeleter> buf(
      static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>(bytes))));
  if (!buf)
    throw Error(ErrorKind::kOutOfRange, "machine probe: cannot allocate the " +
                                            std::to_string(bytes >> 20) +
                                            " MiB read buffer; give a smaller one");
  // Chunks of 4 MiB handed out dynamically, as BM_ReadBandwidth's: a thread that is
  // descheduled for a moment leaves its share to the others instead of stretching the pass.
  const int64_t per = std::min<int64_t>(n, int64_t{1} << 20);
  const int64_t chunks = n / per;  // the tail past whole chunks is not read
  float* p = buf.get();
  pool.parallel_for(chunks, [&](int64_t t) {  // first touch by the threads that read it
    for (int64_t i = t * per; i < (t + 1) * per; ++i) p[i] = static_cast<float>(i & 7);
  });
  std::vector<float> partial(static_cast<size_t>(chunks));
  const double read_bytes = static_cast<double>(chunks * per) * sizeof(float);
  double best_s = 0;
  for (int rep = -1; rep < o.read_repetitions; ++rep) {
    const auto t0 = Clock::now();
    pool.parallel_for(
        chunks, [&](int64_t t) { partial[static_cast<size_t>(t)] = read_sum(p + t * per, per); });
    const double s = seconds_since(t0);
    if (rep >= 0 && (best_s == 0 || s < best_s)) best_s = s;
  }
  float sink = 0;
  for (float x : partial) sink += x;
  r.read_bytes_per_s = read_bytes / best_s;
  buf.reset();

  const int64_t tasks = pool.n_threads();
  std::vector<float> lanes(static_cast<size_t>(tasks));
  best_s = 0;
  for (int rep = -1; rep < o.fma_repetitions; ++rep) {  // rep -1: wakes the workers and the
    const auto t0 = Clock::now();                       // wide units (AVX-512 licences)
    pool.parallel_for(
        tasks, [&](int64_t t) { lanes[static_cast<size_t>(t)] = fma_chains(o.fma_iterations); });
    const double s = seconds_since(t0);
    if (rep >= 0 && (best_s == 0 || s < best_s)) best_s = s;
  }
  for (float x : lanes) sink += x;
  volatile float keep = sink;  // a use of both loops' results: neither can be optimised out
  (void)keep;
  r.fma_flops_per_s = 2.0 * static_cast<double>(tasks) * static_cast<double>(o.fma_iterations) *
                      kFmaChains * kFmaLanes / best_s;
  return r;
}

}  // namespace kvcache
