// The "cpu" backend of complex_scan: the recurrence run sequentially in time, vectorised over rotary pairs,
// with rows of (batch, head, up to `block` pairs) shared dynamically among a few threads. The caller may pass
// H = 1 and P = heads · pairs: the heads of one (b, t) are contiguous, so a row then spans several heads and
// each step reads one contiguous run of memory.
//
//     s_t = a_t · s_{t−1} + x_t                          (forward,  y_t = s_t)
//     λ_t = dy_t + conj(a_{t+1}) · λ_{t+1}                (backward, λ_{T−1} = dy_{T−1} + dfinal)
//     dx_t = λ_t,   gz_t = conj(λ_t) · a_t · s_{t−1},   ds0 = conj(a_0) · λ_0
//
// Re gz is ∂log γ_t and Im gz is ∂θ_t (a_t = γ_t e^{−iθ_t}), written to two separate buffers; gz is formed
// from the product a_t·s_{t−1}, never from s_t − x_t (which cancels when the decay is strong).
// log γ = −∞ gives a_t = 0 exactly (libm's exp in the fix-up loop below): the packed-sequence path of
// interface.py uses it to restart the state at each sequence's first token.
//
// The decay a_t = exp(log γ_t)·(cos θ_t − i sin θ_t) is formed inside the loop from log_decay and theta
// (Bd, Td, H, P) each, with batch / time strides that are 0 where the caller broadcasts (never materialised).
// float32 uses the vectorisable exp / sincos below (within 2 ulp of libm, checked by the tests); float64, for
// reference checks, uses libm.
// Other layouts (contiguous): x, y, dy, dx (B, T, H, 2P) with pair p at (2p, 2p+1); s0, final, dfinal,
// ds0 (B, H, 2P); gld = Re gz and gth = Im gz, (B, Tz, H, P) each, with Tz ∈ {1, T} (Tz = 1: summed over
// time here, in double); either may be null (not needed).
// No torch headers: plain C entry points called through ctypes (which releases the GIL), so the build
// takes about a second and needs only a C++ compiler.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>
#ifdef __linux__
#include <sys/mman.h>
#endif

namespace {

constexpr int64_t kPairs = 256;  // the most pairs per row block (its state and decays live in L1)

// Run body(item) for item in [0, n_items) on up to n_threads threads (the caller is one of them).
// Items are handed out one at a time, so a thread descheduled by another process delays only its row.
template <typename Body>
void run_rows(int64_t n_items, int n_threads, Body body) {
  const int n = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n_threads, n_items)));
  std::atomic<int64_t> next{0};
  auto worker = [&]() {
    for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) body(i);
  };
  std::vector<std::thread> pool;
  pool.reserve(n - 1);
  for (int k = 1; k < n; ++k) pool.emplace_back(worker);
  worker();
  for (auto& th : pool) th.join();
}

// Where one row's decay factors start, and how far they move per step.
// Every buffer the scan writes is a fresh allocation (torch.empty), untouched until it is written, and a first
// write to a 4 KiB page is a page fault: for a 32 MiB output that costs more than the scan itself (about 15 ms of
// the ~20 ms of a fresh tensor's first write on the CI machine), and faults do not scale across threads.
// Transparent huge pages make it 16 faults of 2 MiB instead of 8192 of 4 KiB. A hint only: where THP is
// off, or off Linux, nothing changes. Only whole pages inside the buffer are advised.
extern "C" void advise_huge_pages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kPage = 4096;
  if (p == nullptr || bytes < (int64_t(4) << 20)) return;
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes)) & ~(kPage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

template <typename F>
struct Decay {
  const F *log_decay, *theta;
  int64_t ld_batch, ld_time, th_batch, th_time;
};

// a_j = exp(ld_j)·(cos th_j − i·sin th_j) for j < n. float64: libm.
inline void decay_factors(const double* __restrict__ ld, const double* __restrict__ th, int64_t n,
                          double* __restrict__ ar, double* __restrict__ ai) {
  for (int64_t j = 0; j < n; ++j) {
    const double g = std::exp(ld[j]);
    ar[j] = g * std::cos(th[j]);
    ai[j] = -g * std::sin(th[j]);
  }
}

// float32: one branch-free loop the compiler vectorises (plain SSE2 is enough), then a fix-up loop that redoes
// with libm the rare inputs outside the ranges the polynomials cover (log γ outside [−87, 88], |θ| > 8192,
// infinities, NaN).
//   exp: x = k·ln2 + r, |r| ≤ ln2/2 (ln2 in two parts, Cody–Waite), exp(r) by a degree-7 polynomial,
//        2^k built in the exponent bits.
//   sincos: θ = q·π/2 + r, |r| ≤ π/4 (π/2 in three parts), minimax polynomials for sin r and cos r, then the
//        quadrant q mod 4 swaps and negates them.
// Rounding to the nearest integer uses the 1.5·2^23 trick (exact for |v| < 2^22), so no SSE4.1 is needed.
inline void decay_factors(const float* __restrict__ ld, const float* __restrict__ th, int64_t n,
                          float* __restrict__ ar, float* __restrict__ ai) {
  constexpr float kRound = 12582912.0f;  // 1.5·2^23
  for (int64_t j = 0; j < n; ++j) {
    float x = ld[j];
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);  // outside: redone below (NaN becomes −87 here)
    const float kf = (x * 1.44269504088896341f + kRound) - kRound;
    float r = x - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t k = static_cast<int32_t>(kf);  // in [−126, 127]
    const float g = p * __builtin_bit_cast(float, static_cast<uint32_t>(k + 127) << 23);

    const float t = std::fabs(th[j]) <= 8192.0f ? th[j] : 0.0f;  // outside: redone below (NaN too)
    const float qf = (t * 0.636619772367581343f + kRound) - kRound;
    const float u = ((t - qf * 1.5703125f) - qf * 4.837512969970703125e-4f) - qf * 7.54978995489188216e-8f;
    const int32_t q = static_cast<int32_t>(qf);
    const float z = u * u;
    const float sn0 = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * u + u;
    const float cs0 = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z
                      - 0.5f * z + 1.0f;
    float sn = (q & 1) ? cs0 : sn0;
    float cs = (q & 1) ? sn0 : cs0;
    sn = (q & 2) ? -sn : sn;
    cs = ((q + 1) & 2) ? -cs : cs;
    ar[j] = g * cs;
    ai[j] = -g * sn;
  }
  for (int64_t j = 0; j < n; ++j) {
    if (!(ld[j] >= -87.0f && ld[j] <= 88.0f && std::fabs(th[j]) <= 8192.0f)) {
      const float g = std::exp(ld[j]);
      ar[j] = g * std::cos(th[j]);
      ai[j] = -g * std::sin(th[j]);
    }
  }
}

struct Row {
  int64_t b, h, p0, n;  // batch, head, first pair, pairs in this block
};

inline Row row_of(int64_t item, int64_t H, int64_t P, int64_t block) {
  const int64_t blocks = (P + block - 1) / block;
  Row r;
  r.p0 = (item % blocks) * block;
  r.h = (item / blocks) % H;
  r.b = item / (blocks * H);
  r.n = std::min(block, P - r.p0);
  return r;
}

// One time step of one row: s_j ← a_j s_j + x_j, y_j = s_j for its n pairs (interleaved re, im in x and y).
// Nothing aliases (restrict), so the compiler vectorises over the pairs.
template <typename F>
inline void step_pairs(const F* __restrict__ ar, const F* __restrict__ ai, F* __restrict__ sr, F* __restrict__ si,
                       const F* __restrict__ x, F* __restrict__ y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    const F nr = ar[j] * sr[j] - ai[j] * si[j] + x[2 * j];
    const F ni = ar[j] * si[j] + ai[j] * sr[j] + x[2 * j + 1];
    sr[j] = nr;
    si[j] = ni;
    y[2 * j] = nr;
    y[2 * j + 1] = ni;
  }
}

template <typename F>
void forward(const F* x, Decay<F> dec, const F* s0, F* y, F* final_state, int64_t B, int64_t T, int64_t H,
             int64_t P, int64_t block, int n_threads) {
  const int64_t D = 2 * P, step = H * D;
  block = std::max<int64_t>(1, std::min(block, kPairs));
  run_rows(B * H * ((P + block - 1) / block), n_threads, [&](int64_t item) {
    const Row r = row_of(item, H, P, block);
    F sr[kPairs], si[kPairs];
    const F* init = s0 ? s0 + (r.b * H + r.h) * D + 2 * r.p0 : nullptr;
    for (int64_t j = 0; j < r.n; ++j) {
      sr[j] = init ? init[2 * j] : F(0);
      si[j] = init ? init[2 * j + 1] : F(0);
    }
    const F* xt = x + (r.b * T * H + r.h) * D + 2 * r.p0;
    F* yt = y + (r.b * T * H + r.h) * D + 2 * r.p0;
    const int64_t pair = r.h * P + r.p0;
    const F* lt = dec.log_decay + r.b * dec.ld_batch + pair;
    const F* tt = dec.theta + r.b * dec.th_batch + pair;
    F ar[kPairs], ai[kPairs];
    if (dec.ld_time == 0 && dec.th_time == 0) {  // static decay: a_j is the same at every step
      decay_factors(lt, tt, r.n, ar, ai);
      for (int64_t t = 0; t < T; ++t, xt += step, yt += step) step_pairs<F>(ar, ai, sr, si, xt, yt, r.n);
    } else {
      for (int64_t t = 0; t < T; ++t, xt += step, yt += step, lt += dec.ld_time, tt += dec.th_time) {
        decay_factors(lt, tt, r.n, ar, ai);
        step_pairs<F>(ar, ai, sr, si, xt, yt, r.n);
      }
    }
    F* fin = final_state + (r.b * H + r.h) * D + 2 * r.p0;
    for (int64_t j = 0; j < r.n; ++j) {
      fin[2 * j] = sr[j];
      fin[2 * j + 1] = si[j];
    }
  });
}

template <typename F>
void backward(Decay<F> dec, const F* y, const F* s0, const F* dy, const F* dfinal, F* dx, F* gld, F* gth,
              int64_t g_time, F* ds0, int64_t B, int64_t T, int64_t H, int64_t P, int64_t block,
              int n_threads) {
  const int64_t D = 2 * P, step = H * D;
  const int64_t g_batch = (g_time ? T : 1) * H * P;  // gld / gth: (B, Tz, H, P)
  const bool need_gz = gld != nullptr || gth != nullptr;
  block = std::max<int64_t>(1, std::min(block, kPairs));
  run_rows(B * H * ((P + block - 1) / block), n_threads, [&](int64_t item) {
    const Row r = row_of(item, H, P, block);
    const int64_t head = r.h * D + 2 * r.p0;  // offset of the block within one (b, t) slice
    F cr[kPairs], ci[kPairs];                  // carry: conj(a_{t+1}) λ_{t+1} (+ dfinal at the end)
    F ar[kPairs], ai[kPairs], lr[kPairs], li[kPairs];  // a_t and λ_t
    F zr[kPairs], zi[kPairs];                  // conj(λ_t) a_t s_{t−1}
    double gr[kPairs], gi[kPairs];             // time-summed gz (g_time == 0)
    const F* fin = dfinal ? dfinal + r.b * H * D + head : nullptr;
    for (int64_t j = 0; j < r.n; ++j) {
      cr[j] = fin ? fin[2 * j] : F(0);
      ci[j] = fin ? fin[2 * j + 1] : F(0);
      gr[j] = gi[j] = 0.0;
    }
    const F* init = s0 ? s0 + r.b * H * D + head : nullptr;
    for (int64_t t = T - 1; t >= 0; --t) {
      const int64_t off = (r.b * T + t) * step + head;
      const int64_t pair = r.h * P + r.p0;
      // a_t (for a static decay, formed once)
      if (t == T - 1 || dec.ld_time != 0 || dec.th_time != 0)
        decay_factors(dec.log_decay + r.b * dec.ld_batch + t * dec.ld_time + pair,
                      dec.theta + r.b * dec.th_batch + t * dec.th_time + pair, r.n, ar, ai);
      const F* dyt = dy ? dy + off : nullptr;
      const F* prev = t > 0 ? y + off - step : init;  // s_{t−1}, or s0 (null: zeros) at t = 0
      F* dxt = dx ? dx + off : nullptr;
      // Separate loops, each without a branch inside, so that every one vectorises.
      if (dyt) {
        for (int64_t j = 0; j < r.n; ++j) {
          lr[j] = cr[j] + dyt[2 * j];
          li[j] = ci[j] + dyt[2 * j + 1];
        }
      } else {
        for (int64_t j = 0; j < r.n; ++j) {
          lr[j] = cr[j];
          li[j] = ci[j];
        }
      }
      if (dxt) {
        for (int64_t j = 0; j < r.n; ++j) {
          dxt[2 * j] = lr[j];
          dxt[2 * j + 1] = li[j];
        }
      }
      if (need_gz) {
        for (int64_t j = 0; j < r.n; ++j) {
          const F pr = prev ? prev[2 * j] : F(0), pi = prev ? prev[2 * j + 1] : F(0);
          const F qr = ar[j] * pr - ai[j] * pi, qi = ar[j] * pi + ai[j] * pr;  // a_t · s_{t−1}
          zr[j] = lr[j] * qr + li[j] * qi;                          // conj(λ_t) · a_t · s_{t−1}
          zi[j] = lr[j] * qi - li[j] * qr;
        }
        if (g_time) {
          const int64_t g_off = r.b * g_batch + t * g_time + r.h * P + r.p0;
          if (gld) std::copy(zr, zr + r.n, gld + g_off);
          if (gth) std::copy(zi, zi + r.n, gth + g_off);
        } else {
          for (int64_t j = 0; j < r.n; ++j) {
            gr[j] += zr[j];
            gi[j] += zi[j];
          }
        }
      }
      for (int64_t j = 0; j < r.n; ++j) {
        cr[j] = ar[j] * lr[j] + ai[j] * li[j];  // conj(a_t) · λ_t
        ci[j] = ar[j] * li[j] - ai[j] * lr[j];
      }
    }
    if (need_gz && !g_time) {
      const int64_t g_off = r.b * g_batch + r.h * P + r.p0;
      for (int64_t j = 0; j < r.n; ++j) {
        if (gld) gld[g_off + j] = static_cast<F>(gr[j]);
        if (gth) gth[g_off + j] = static_cast<F>(gi[j]);
      }
    }
    if (ds0) {
      F* d = ds0 + r.b * H * D + head;
      for (int64_t j = 0; j < r.n; ++j) {
        d[2 * j] = cr[j];
        d[2 * j + 1] = ci[j];
      }
    }
  });
}

}  // namespace

#define HYBRID_SCAN_ENTRY_POINTS(F, suffix)                                                                 \
  extern "C" void scan_forward_##suffix(const F* x, const F* log_decay, const F* theta,                    \
                                        const int64_t* decay_strides, const F* s0, F* y, F* final_state,   \
                                        int64_t B, int64_t T, int64_t H, int64_t P, int64_t block,          \
                                        int n_threads) {                                                    \
    const int64_t* d = decay_strides; /* ld_batch, ld_time, th_batch, th_time */                            \
    forward<F>(x, Decay<F>{log_decay, theta, d[0], d[1], d[2], d[3]}, s0, y, final_state, B, T, H, P,      \
               block, n_threads);                                                                           \
  }                                                                                                         \
  extern "C" void scan_backward_##suffix(const F* log_decay, const F* theta,                               \
                                         const int64_t* decay_strides, const F* y, const F* s0,            \
                                         const F* dy, const F* dfinal, F* dx, F* gld, F* gth,               \
                                         int64_t g_time, F* ds0, int64_t B, int64_t T, int64_t H, int64_t P, \
                                         int64_t block, int n_threads) {                                    \
    const int64_t* d = decay_strides;                                                                       \
    backward<F>(Decay<F>{log_decay, theta, d[0], d[1], d[2], d[3]}, y, s0, dy, dfinal, dx, gld, gth,       \
                g_time, ds0, B, T, H, P, block, n_threads);                                                 \
  }

HYBRID_SCAN_ENTRY_POINTS(float, f32)
HYBRID_SCAN_ENTRY_POINTS(double, f64)
