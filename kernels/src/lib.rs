//! CPU compute kernels of rredcot's model core, in a crate of their own so that every build
//! profile compiles them optimised (the workspace's Cargo.toml sets `opt-level = 3` for this
//! package in the dev profile too). Why: the debug build of a SIMD loop runs every intrinsic
//! as a function call; the tests and the debug worker decode real models through this kernel,
//! and at `opt-level = 0` it made CI's model-parity tests run for ~8 minutes.
//!
//! [`x_wt`]: `x · Wᵀ (+ b)` for a few rows of `x`, the matrix products of a decode step. Why
//! our own kernel, and where it is used: `rredcot-ml`'s `model::cpu_matmul`.

pub use imp::{supported, x_wt};

#[cfg(target_arch = "x86_64")]
mod imp {
    use std::arch::x86_64::*;

    /// Whether this CPU runs [`x_wt`] (AVX2 and FMA).
    pub fn supported() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }

    /// `out[j, r] = Σ_k x[j, k]·w[r, k] (+ b[r])` for `x: [m, k]`, `w: [n, k]`, `out: [m, n]`.
    ///
    /// The weight rows are shared out in runs of four over `threads` threads (rayon's pool):
    /// every output element is summed by one thread in one order, so the result does not
    /// depend on the thread count.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA ([`supported`]).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn x_wt(threads: usize, m: usize, n: usize, k: usize, x: &[f32], w: &[f32], b: Option<&[f32]>, out: &mut [f32]) {
        assert!(x.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
        assert!(b.is_none_or(|b| b.len() >= n));
        let threads = threads.max(1);
        let p = Panel { x: x.as_ptr(), w: w.as_ptr(), b: b.map(<[f32]>::as_ptr), out: out.as_mut_ptr(), n, k };
        let per = n.div_ceil(threads).next_multiple_of(4);
        if threads == 1 || n * k < MIN_SPLIT || per >= n {
            return rows(&p, m, 0, n);
        }
        rayon::scope(|s| {
            for start in (0..n).step_by(per) {
                let p = &p;
                s.spawn(move |_| rows(p, m, start, (start + per).min(n)));
            }
        });
    }

    /// Weights smaller than this (floats) are not split over threads: a hand-off costs more
    /// than their product (the tiny test models').
    const MIN_SPLIT: usize = 1 << 16;

    /// Weight rows `from..to` for every row of `x`. The rows are read as four streams, from
    /// four quarters of the range at once: one core's loads then keep more of memory's
    /// bandwidth busy than one sequential stream does (bench/model.md: a 1-row pass over
    /// 540 MB 38–42 ms this way, 55–66 ms over adjacent rows with the next four prefetched).
    /// Each output element is still one row's sum in one order, whatever the grouping, so the
    /// results do not depend on it.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn rows(p: &Panel, m: usize, from: usize, to: usize) {
        let (q, m2) = ((to - from) / 4, m - m % 2);
        for i in from..from + q {
            let r = [i, i + q, i + 2 * q, i + 3 * q];
            for j in (0..m2).step_by(2) {
                p.tile::<4, 2>(r, j);
            }
            if m2 < m {
                p.tile::<4, 1>(r, m2);
            }
        }
        for r in from + 4 * q..to {
            for j in (0..m2).step_by(2) {
                p.tile::<1, 2>([r], j);
            }
            if m2 < m {
                p.tile::<1, 1>([r], m2);
            }
        }
    }

    /// The operands as raw pointers (bounds asserted by [`x_wt`]).
    struct Panel {
        x: *const f32,
        w: *const f32,
        b: Option<*const f32>,
        out: *mut f32,
        n: usize,
        k: usize,
    }

    // SAFETY: threads read `x`, `w`, `b` and write disjoint columns of `out` (their own weight
    // rows), all alive until `rayon::scope` returns.
    unsafe impl Sync for Panel {}

    impl Panel {
        /// Weight rows `rows` times rows `j0..j0 + J` of `x`: R·J sums of 8-wide products,
        /// each weight vector loaded once for the J rows.
        #[inline(always)]
        unsafe fn tile<const R: usize, const J: usize>(&self, rows: [usize; R], j0: usize) {
            let k = self.k;
            let k8 = k - k % 8;
            let mut acc = [[_mm256_setzero_ps(); J]; R];
            for kk in (0..k8).step_by(8) {
                let mut xv = [_mm256_setzero_ps(); J];
                for (j, v) in xv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(self.x.add((j0 + j) * k + kk));
                }
                for (&r, acc_r) in rows.iter().zip(acc.iter_mut()) {
                    let wv = _mm256_loadu_ps(self.w.add(r * k + kk));
                    for (a, v) in acc_r.iter_mut().zip(&xv) {
                        *a = _mm256_fmadd_ps(wv, *v, *a);
                    }
                }
            }
            for (&r, acc_r) in rows.iter().zip(&acc) {
                for (j, a) in acc_r.iter().enumerate() {
                    let mut s = horizontal_sum(*a);
                    for t in k8..k {
                        s += *self.x.add((j0 + j) * k + t) * *self.w.add(r * k + t);
                    }
                    if let Some(b) = self.b {
                        s += *b.add(r);
                    }
                    *self.out.add((j0 + j) * self.n + r) = s;
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn horizontal_sum(a: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
    }
}

/// Other CPUs keep libtorch's product.
#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub fn supported() -> bool {
        false
    }
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn x_wt(_: usize, _: usize, _: usize, _: usize, _: &[f32], _: &[f32], _: Option<&[f32]>, _: &mut [f32]) {
        unreachable!("the kernel is not built for this CPU")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) (a 64-bit LCG's high bits).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 23) as f32) - 1.0
            })
            .collect()
    }

    /// Every tile shape and tail (rows of x odd and even, weight rows not a multiple of 4, K
    /// not a multiple of 8, with and without bias) against the same sums in float64.
    #[test]
    fn products_equal_float64_sums() {
        if !supported() {
            eprintln!("SKIP: this CPU has no AVX2/FMA; the kernel is not used");
            return;
        }
        for (m, n, k) in [(1, 7, 13), (2, 576, 576), (3, 190, 1536), (8, 9, 64), (32, 33, 40), (5, 1, 8)] {
            for with_bias in [false, true] {
                let (x, w, b) = (values(m * k, 1), values(n * k, 2), values(n, 3));
                let b = with_bias.then_some(b.as_slice());
                let mut out = vec![f32::NAN; m * n];
                unsafe { x_wt(1, m, n, k, &x, &w, b, &mut out) };
                for j in 0..m {
                    for r in 0..n {
                        let exact: f64 = (0..k).map(|t| x[j * k + t] as f64 * w[r * k + t] as f64).sum::<f64>()
                            + b.map_or(0.0, |b| b[r] as f64);
                        let err = (out[j * n + r] as f64 - exact).abs();
                        assert!(err < 1e-5 * (k as f64).sqrt(), "[{m}, {k}] x [{n}, {k}] bias {with_bias}: ({j}, {r}) off by {err}");
                    }
                }
            }
        }
    }

    /// Split over threads, every output element is the one-thread kernel's, bit for bit.
    #[test]
    fn the_thread_count_does_not_change_the_result() {
        if !supported() {
            eprintln!("SKIP: this CPU has no AVX2/FMA; the kernel is not used");
            return;
        }
        let (m, n, k) = (3usize, 1030usize, 200usize);
        let (x, w, b) = (values(m * k, 5), values(n * k, 6), values(n, 7));
        let run = |threads| {
            let mut out = vec![f32::NAN; m * n];
            unsafe { x_wt(threads, m, n, k, &x, &w, Some(&b), &mut out) };
            out
        };
        let one = run(1);
        assert!(one.iter().all(|v| v.is_finite()));
        for threads in [2, 3, 7] {
            assert!(run(threads).iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{threads} threads");
        }
    }
}
