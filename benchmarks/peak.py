"""The machine's float32 FMA peak, measured, not assumed: a micro-kernel of independent
fused multiply-adds on the widest vectors this CPU has (AVX-512, else AVX2+FMA), compiled
here with `cc`, run on every benchmark thread at once. What GEMMs and convolutions reach is
quoted as a share of it. On CPUs with avx512_bf16, the bfloat16 dot-product peak too
(`vdpbf16ps`: 16 lanes of two multiply-adds each, into float32), the limit of GEMMs run in
bfloat16 (Blade's Config(precision="bf16"), OpenVINO's default there). On CPUs with
avx512_vnni, the int8 dot-product peak (`vpdpbusd`: 16 lanes of four u8 x s8 products
added into int32, counted as 2 ops each); on CPUs with AVX2 but no VNNI, the rate of the
three instructions that stand in for it (`vpmaddubsw`, pairs of u8 x s8 products into
int16; `vpmaddwd` by ones, pairs of those into int32; `vpaddd`); and the rate of oneDNN's
own u8 x s8 GEMM on a large square problem, which reaches past the first on CPUs with AMX:
the limits of int8 engines.
And the rate at which the threads read memory (`measure_read_bandwidth`), the limit of a
decode step that reads every weight once (benchmarks/decode.py).

    python benchmarks/peak.py      # prints the peak in GFLOP/s and what it was built for
"""
import ctypes
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from blade import _C

THREADS = 2

# Independent accumulators hide the FMA latency (4-5 cycles, 2 FMA ports: 8-10 chains in
# flight) on every x86 core of the last decade. They must all fit in registers with the two
# operands: AVX2 has 16 vector registers, so 12 accumulators there (16 made the compiler
# merge three of them into one dependency chain, and the peak read a third low); AVX-512
# has 32.
KERNEL = r"""
#include <immintrin.h>
#include <stdint.h>

#if defined(__AVX512F__)
#define VEC __m512
#define LANES 16
#define CHAINS 16
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define ADD _mm512_add_ps
#define STORE _mm512_storeu_ps
#define LOAD _mm512_loadu_ps
#else
#define VEC __m256
#define LANES 8
#define CHAINS 12
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define ADD _mm256_add_ps
#define STORE _mm256_storeu_ps
#define LOAD _mm256_loadu_ps
#endif

int lanes(void) { return LANES; }
int chains(void) { return CHAINS; }

/* 2 * LANES * CHAINS * iterations flops; the result keeps the compiler from dropping them. */
float fma_loop(int64_t iterations) {
  VEC a = SET1(1.0000001f), b = SET1(0.9999999f);
  VEC acc[CHAINS];
  for (int i = 0; i < CHAINS; ++i) acc[i] = SET1((float)i);
  for (int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < CHAINS; ++i) acc[i] = FMA(acc[i], a, b);
  }
  VEC sum = acc[0];
  for (int i = 1; i < CHAINS; ++i) sum = ADD(sum, acc[i]);
  float out[LANES];
  STORE(out, sum);
  return out[0];
}

/* Reads n floats (n a multiple of 8 * LANES) once: vector loads into 8 independent sums,
   which the loads, not the adds, bound on a buffer larger than the caches. */
float read_loop(const float* p, int64_t n) {
  VEC acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = SET1(0.0f);
  for (int64_t k = 0; k < n; k += 8 * LANES) {
    /* Software prefetch 8 KiB ahead, as GEMV kernels do: one core's hardware prefetch
       alone keeps too few misses in flight to reach the memory's rate. */
    for (int i = 0; i < 8 * LANES; i += 16) __builtin_prefetch(p + k + 2048 + i, 0, 1);
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) acc[i] = ADD(acc[i], LOAD(p + k + i * LANES));
  }
  VEC sum = acc[0];
  for (int i = 1; i < 8; ++i) sum = ADD(sum, acc[i]);
  float out[LANES];
  STORE(out, sum);
  return out[0];
}

#if defined(__AVX512BF16__)
/* 4 * 16 * 16 * iterations flops (each lane: two bfloat16 products added into float32). */
float dpbf16_loop(int64_t iterations) {
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3F80), b = (__m512bh)_mm512_set1_epi16(0x3F80);
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps((float)i);
  for (int64_t n = 0; n < iterations; ++n) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  float out[16];
  _mm512_storeu_ps(out, sum);
  return out[0];
}
#endif

#if defined(__AVX512VNNI__)
/* 2 * 64 * 12 * iterations int8 ops (each lane: four u8 x s8 products added into int32),
   in 12 chains. Written in assembly: from intrinsics GCC copied each accumulator to
   another register every iteration, and a core that runs two dot products a cycle (AMD's
   Zen 5) read half its peak. */
#define DPBUSD(acc) "vpdpbusd %[b], %[a], %[" #acc "]\n\t"
float vnni_loop(int64_t iterations) {
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  __m512i c0 = _mm512_set1_epi32(0), c1 = _mm512_set1_epi32(1), c2 = _mm512_set1_epi32(2),
          c3 = _mm512_set1_epi32(3), c4 = _mm512_set1_epi32(4), c5 = _mm512_set1_epi32(5),
          c6 = _mm512_set1_epi32(6), c7 = _mm512_set1_epi32(7), c8 = _mm512_set1_epi32(8),
          c9 = _mm512_set1_epi32(9), c10 = _mm512_set1_epi32(10),
          c11 = _mm512_set1_epi32(11);
  if (iterations > 0) {
    __asm__ volatile(
        "1:\n\t"
        DPBUSD(c0) DPBUSD(c1) DPBUSD(c2) DPBUSD(c3) DPBUSD(c4) DPBUSD(c5) DPBUSD(c6)
        DPBUSD(c7) DPBUSD(c8) DPBUSD(c9) DPBUSD(c10) DPBUSD(c11)
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        : [c0] "+v"(c0), [c1] "+v"(c1), [c2] "+v"(c2), [c3] "+v"(c3), [c4] "+v"(c4),
          [c5] "+v"(c5), [c6] "+v"(c6), [c7] "+v"(c7), [c8] "+v"(c8), [c9] "+v"(c9),
          [c10] "+v"(c10), [c11] "+v"(c11), [n] "+r"(iterations)
        : [a] "v"(a), [b] "v"(b)
        : "cc");
  }
  __m512i sum = _mm512_add_epi32(c0, c1);
  sum = _mm512_add_epi32(sum, _mm512_add_epi32(c2, c3));
  sum = _mm512_add_epi32(sum, _mm512_add_epi32(c4, c5));
  sum = _mm512_add_epi32(sum, _mm512_add_epi32(c6, c7));
  sum = _mm512_add_epi32(sum, _mm512_add_epi32(c8, c9));
  sum = _mm512_add_epi32(sum, _mm512_add_epi32(c10, c11));
  int out[16];
  _mm512_storeu_si512(out, sum);
  return (float)out[0];
}
#endif

#if defined(__AVX2__) && !defined(__AVX512VNNI__)
/* 2 * 32 * 10 * iterations int8 ops: per chain, 32 u8 x s8 products summed into 8 int32
   lanes. The chain's accumulator is also the u8 operand, so no product is loop-invariant;
   10 chains cover the three instructions' latency with both multiply ports busy. Written
   in assembly: with intrinsics, GCC spilled accumulators and read the peak low. */
#define PAIR_SUMS(acc, tmp) \
  "vpmaddubsw %[b], %[" #acc "], %%" #tmp "\n\t" \
  "vpmaddwd %[ones], %%" #tmp ", %%" #tmp "\n\t" \
  "vpaddd %%" #tmp ", %[" #acc "], %[" #acc "]\n\t"
float pair_sums_loop(int64_t iterations) {
  const __m256i b = _mm256_set1_epi8(1), ones = _mm256_set1_epi16(1);
  __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1), a2 = _mm256_set1_epi32(2),
          a3 = _mm256_set1_epi32(3), a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5),
          a6 = _mm256_set1_epi32(6), a7 = _mm256_set1_epi32(7), a8 = _mm256_set1_epi32(8),
          a9 = _mm256_set1_epi32(9);
  if (iterations > 0) {
    __asm__ volatile(
        "1:\n\t"
        PAIR_SUMS(a0, ymm12) PAIR_SUMS(a1, ymm13) PAIR_SUMS(a2, ymm14) PAIR_SUMS(a3, ymm15)
        PAIR_SUMS(a4, ymm12) PAIR_SUMS(a5, ymm13) PAIR_SUMS(a6, ymm14) PAIR_SUMS(a7, ymm15)
        PAIR_SUMS(a8, ymm12) PAIR_SUMS(a9, ymm13)
        "dec %[n]\n\t"
        "jnz 1b\n\t"
        : [a0] "+x"(a0), [a1] "+x"(a1), [a2] "+x"(a2), [a3] "+x"(a3), [a4] "+x"(a4),
          [a5] "+x"(a5), [a6] "+x"(a6), [a7] "+x"(a7), [a8] "+x"(a8), [a9] "+x"(a9),
          [n] "+r"(iterations)
        : [b] "x"(b), [ones] "x"(ones)
        : "ymm12", "ymm13", "ymm14", "ymm15", "cc");
  }
  __m256i sum = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(a4, a5), a6));
  sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(a7, a8), a9));
  int out[8];
  _mm256_storeu_si256((__m256i*)out, sum);
  return (float)out[0];
}
#endif
"""


def _cpu_flags():
    # The runtime's one reader of the CPU's flags (csrc/ral/cpu_features.h).
    return set(_C.host_cpu_flags())


def build_kernel(directory: Path):
    """The kernel as a loaded library, and the instruction set it was compiled for."""
    flags = _cpu_flags()
    if "avx512f" in flags:
        isa, cflags = "avx512f", ["-mavx512f", "-mfma"]
        if "avx512_bf16" in flags:
            cflags.append("-mavx512bf16")
        if "avx512_vnni" in flags:
            cflags.append("-mavx512vnni")
    elif "avx2" in flags and "fma" in flags:
        isa, cflags = "avx2+fma", ["-mavx2", "-mfma"]
    else:
        raise RuntimeError("the FMA peak needs AVX2+FMA or AVX-512")
    source, library = directory / "peak.c", directory / "libpeak.so"
    source.write_text(KERNEL)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", *cflags, str(source), "-o", str(library)],
                   check=True)
    kernel = ctypes.CDLL(str(library))   # ctypes releases the GIL during each call
    kernel.fma_loop.argtypes = [ctypes.c_int64]
    kernel.fma_loop.restype = ctypes.c_float
    kernel.read_loop.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    kernel.read_loop.restype = ctypes.c_float
    for loop in ("dpbf16_loop", "vnni_loop", "pair_sums_loop"):  # built with their flags
        if hasattr(kernel, loop):
            getattr(kernel, loop).argtypes = [ctypes.c_int64]
            getattr(kernel, loop).restype = ctypes.c_float
    return kernel, isa


def _rate(loop, flops_per_iteration: int, threads: int, seconds: float) -> float:
    """Median over 5 rounds of `loop`'s GFLOP/s with `threads` threads running it at once."""
    loop(1000)
    # Size one call to about `seconds` on one core.
    start = time.perf_counter()
    loop(10_000_000)
    iterations = max(1, int(10_000_000 * seconds / (time.perf_counter() - start)))
    rates = []
    for _ in range(5):
        elapsed = _at_once([(loop, (iterations,))] * threads)
        rates.append(threads * flops_per_iteration * iterations / elapsed / 1e9)
    rates.sort()
    return rates[len(rates) // 2]


def _at_once(calls) -> float:
    """Seconds for `calls` ((function, args) pairs), each on a thread of its own, all
    started together (ctypes releases the GIL during each)."""
    workers = [threading.Thread(target=f, args=args) for f, args in calls]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def measure_peak_gflops(threads: int = THREADS, seconds: float = 0.3) -> dict:
    """The float32 FMA rate of `threads` threads running at once ("gflops"), and the
    bfloat16 dot-product rate ("bf16_gflops", None without avx512_bf16), the int8 one
    ("int8_gops": VNNI's dot product, else AVX2's pair sums; "int8_isa" says which) and
    oneDNN's int8 GEMM rate ("int8_gemm_gops")."""
    with tempfile.TemporaryDirectory() as tmp:
        kernel, isa = build_kernel(Path(tmp))
        gflops = _rate(kernel.fma_loop, 2 * kernel.lanes() * kernel.chains(), threads, seconds)
        bf16 = int8 = int8_isa = None
        if hasattr(kernel, "dpbf16_loop"):
            bf16 = _rate(kernel.dpbf16_loop, 4 * 16 * 16, threads, seconds)
        if hasattr(kernel, "vnni_loop"):
            int8, int8_isa = _rate(kernel.vnni_loop, 2 * 64 * 12, threads, seconds), \
                "avx512_vnni vpdpbusd"
        elif hasattr(kernel, "pair_sums_loop"):
            int8, int8_isa = _rate(kernel.pair_sums_loop, 2 * 32 * 10, threads, seconds), \
                "avx2 vpmaddubsw + vpmaddwd + vpaddd"
        peak = {"gflops": gflops, "bf16_gflops": bf16, "int8_gops": int8, "int8_isa": int8_isa,
                "isa": isa, "threads": threads}
        if int8:
            peak["int8_gemm_size"] = INT8_GEMM_SIZE
            peak["int8_gemm_gops"] = int8_gemm_gops(threads)
        return peak


# The square int8 GEMM timed for oneDNN's rate: large enough that packing and the output's
# float32 store are small next to the products.
INT8_GEMM_SIZE = 2048


def int8_gemm_gops(threads: int, size: int = INT8_GEMM_SIZE) -> float:
    """oneDNN's u8 x s8 GEMM (onednn::qlinear_pointwise, what Blade's and Inductor's int8
    layers call) on `size`^3, int32 accumulation, float32 output: GOP/s of the fastest of 25
    runs. A limit is what the machine can do: on a shared host the median of a few runs
    swung from 385 to 2755 GOP/s between benches of one session."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.randint(0, 255, (size, size), dtype=torch.uint8)
        # Within what this CPU's kernels multiply exactly (AVX2: +-64), as Blade's weights.
        limit = _C.int8_weight_limit() or 127
        w = torch.randint(-limit, limit + 1, (size, size), dtype=torch.int8)
        packed = torch.ops.onednn.qlinear_prepack(w, [size, size])
        scales, zeros = torch.ones(size), torch.zeros(size, dtype=torch.int32)

        def gemm():
            return torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, scales, zeros, None,
                                                      1.0, 0, torch.float32, "none", [], "")
        for _ in range(3):  # warm: oneDNN's kernel made, the tiles' state set up
            gemm()
        times = []
        for _ in range(25):
            start = time.perf_counter()
            gemm()
            times.append(time.perf_counter() - start)
        return 2 * size ** 3 / min(times) / 1e9
    finally:
        torch.set_num_threads(previous)


# Far larger than any cache, so that what is timed is memory.
READ_BANDWIDTH_BYTES = 1 << 30


class ReadBandwidth:
    """Times how fast `threads` threads read memory at once: each reads its share of a
    buffer of `size` bytes, far larger than the caches, with vector loads (`read_loop`).
    The kernel is built and the buffer paged in once, so a bench can measure the rate
    beside each of its own timings: on a shared host it changes by a third from minute to
    minute."""

    def __init__(self, threads: int = THREADS, size: int = READ_BANDWIDTH_BYTES):
        import torch

        self.threads = threads
        self.buffer = torch.ones(size // 4)
        self.share = self.buffer.numel() // threads // 1024 * 1024
        assert self.share > 0, f"a buffer of {size} bytes is too small to time"
        with tempfile.TemporaryDirectory() as tmp:   # the loaded library outlives its file
            self.kernel, _ = build_kernel(Path(tmp))
        self.measure(1)   # pages the buffer in

    def measure(self, rounds: int = 3) -> float:
        """GB/s: the fastest of `rounds` reads of the whole buffer."""
        rates = []
        for _ in range(rounds):
            elapsed = _at_once([(self.kernel.read_loop,
                                 (self.buffer.data_ptr() + t * self.share * 4, self.share))
                                for t in range(self.threads)])
            rates.append(self.threads * self.share * 4 / elapsed / 1e9)
        return max(rates)


def measure_read_bandwidth(threads: int = THREADS, size: int = READ_BANDWIDTH_BYTES) -> float:
    """The rate in GB/s at which `threads` threads read memory at once (ReadBandwidth), the
    best of 7 rounds. What a decode step that reads every weight once is bound by."""
    return ReadBandwidth(threads, size).measure(7)


if __name__ == "__main__":
    peak = measure_peak_gflops()
    print(f"float32 FMA peak: {peak['gflops']:.1f} GFLOP/s on {peak['threads']} threads "
          f"({peak['isa']})")
    if peak["bf16_gflops"]:
        print(f"bfloat16 dot-product peak: {peak['bf16_gflops']:.1f} GFLOP/s (avx512_bf16)")
    if peak["int8_gops"]:
        print(f"int8 peak: {peak['int8_gops']:.1f} GOP/s ({peak['int8_isa']}); oneDNN's "
              f"u8 x s8 GEMM: {peak['int8_gemm_gops']:.1f} GOP/s")
    print(f"read bandwidth: {measure_read_bandwidth():.1f} GB/s on {THREADS} threads")
    sys.exit(0)
