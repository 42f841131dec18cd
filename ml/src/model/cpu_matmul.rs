//! `x · Wᵀ` for a few rows of `x` on the CPU: the matrix products of a decode step.
//!
//! Why: a decode step multiplies 1–32 rows (one per sequence) by every weight matrix, and the
//! weights (540 MB for SmolLM2-135M in float32) do not stay in cache between steps. libtorch's
//! MKL product repacks each weight per call and runs its small-row kernels well below the
//! memory's bandwidth on our CPU. Measured, one thread, SmolLM2-135M's 30 layers and LM head,
//! weights streamed from memory (bench/model.md): MKL 170–177 ms per step at 8 rows, this kernel
//! 49–54 ms; at 1 row MKL 70–78 ms, this kernel 29–35 ms. The `gemm` and `matrixmultiply`
//! crates took 128–185 ms at 8 rows (they pack too), so the kernel is ours (crate
//! `rredcot-kernels`, built optimised in test builds too):
//! each weight row is read once for all rows of `x`, four weight rows at a time, taken from the
//! four quarters of the rows so that the core reads four streams at once (a plain read of the
//! 540 MB takes 45–58 ms as one stream, 34–39 ms as four, on our CPU).
//!
//! Where it applies ([`linear`]): inference only (autograd off or nothing requiring grad),
//! float32 on the CPU, contiguous weights, at most [`MAX_ROWS`] rows, a CPU with AVX2 and FMA.
//! Everything else keeps libtorch's product. Its sums run in another order than MKL's, so its
//! results differ in the last bits (logits ~1e-5 apart); on one machine they are deterministic.

use tch::{Device, Kind, Tensor};

/// Most rows of `x` this product takes: up to 32 it beat MKL in the measurement above (16 rows
/// 104–110 ms vs 168, 32 rows 169–190 vs 254).
pub const MAX_ROWS: i64 = 32;

/// `x · weightᵀ (+ bias)` for `x: [.., K]`, `weight: [N, K]`, `bias: [N]`, through the kernel
/// above where it applies; `None` where it does not (the caller uses libtorch's product).
pub fn linear(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Option<Tensor> {
    let (m, n, k) = applies(x, weight, bias)?;
    let x = x.contiguous();
    let bias = bias.map(Tensor::contiguous);
    let out = Tensor::empty([m as i64, n as i64], (Kind::Float, x.device()));
    // SAFETY: every tensor is a contiguous float32 CPU tensor of the length given (checked by
    // `applies` and made so above), alive until the end of this function; `out` is fresh.
    unsafe {
        let x = std::slice::from_raw_parts(x.data_ptr() as *const f32, m * k);
        let w = std::slice::from_raw_parts(weight.data_ptr() as *const f32, n * k);
        let b = bias.as_ref().map(|b| std::slice::from_raw_parts(b.data_ptr() as *const f32, n));
        let o = std::slice::from_raw_parts_mut(out.data_ptr() as *mut f32, m * n);
        // As many threads as libtorch's own product would use.
        rredcot_kernels::x_wt(tch::get_num_threads().max(1) as usize, m, n, k, x, w, b, o);
    }
    let mut out_shape = x.size();
    *out_shape.last_mut()? = n as i64;
    Some(out.view(out_shape.as_slice()))
}

/// Whether the kernel is used at all: the CPU has what it needs, and `RREDCOT_CPU_MATMUL=0` does
/// not turn it off (to compare with MKL's products, bench/model.md).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| rredcot_kernels::supported() && std::env::var("RREDCOT_CPU_MATMUL").map_or(true, |v| v != "0"))
}

/// `(rows of x, N, K)` where the kernel applies to these operands, else `None`.
fn applies(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>) -> Option<(usize, usize, usize)> {
    // host: the kernel reads CPU memory; it tests where the operands are, and makes nothing.
    if !enabled() || x.device() != Device::Cpu || weight.device() != Device::Cpu {
        return None;
    }
    if x.kind() != Kind::Float || weight.kind() != Kind::Float || weight.dim() != 2 || !weight.is_contiguous() {
        return None;
    }
    let (n, k) = (weight.size()[0], weight.size()[1]);
    if x.dim() == 0 || x.size().last() != Some(&k) || k == 0 {
        return None;
    }
    let rows = x.numel() as i64 / k;
    if rows == 0 || rows > MAX_ROWS {
        return None;
    }
    if let Some(b) = bias {
        // host: as above, a test of where the bias is.
        if b.kind() != Kind::Float || b.device() != Device::Cpu || b.size() != [n] {
            return None;
        }
    }
    let tracked = x.requires_grad() || weight.requires_grad() || bias.is_some_and(Tensor::requires_grad);
    (!(tracked && grad_enabled())).then_some((rows as usize, n as usize, k as usize))
}

/// Whether autograd records operations here (tch keeps its own query private).
fn grad_enabled() -> bool {
    // SAFETY: plain calls into libtorch's thread-local grad mode; the second restores the first.
    unsafe {
        let prev = torch_sys::at_grad_set_enabled(0);
        torch_sys::at_grad_set_enabled(prev);
        prev != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn randn(shape: &[i64], seed: i64) -> Tensor {
        tch::manual_seed(seed);
        Tensor::randn(shape, (Kind::Float, Device::Cpu))
    }

    /// Every tile shape and tail (rows of x odd and even, weight rows not a multiple of 4,
    /// K not a multiple of 8, with and without bias, 1–3 leading dimensions) against libtorch's
    /// product in float64.
    #[test]
    fn few_row_products_equal_libtorchs() {
        if !rredcot_kernels::supported() {
            eprintln!("SKIP: this CPU has no AVX2/FMA; the kernel is not used");
            return;
        }
        let mut checked = 0;
        for (lead, n, k) in [(vec![1i64], 7i64, 13i64), (vec![2, 1], 576, 576), (vec![3], 190, 1536), (vec![8], 9, 64), (vec![4, 8], 33, 40), (vec![5], 1, 8)] {
            for with_bias in [false, true] {
                let mut shape = lead.clone();
                shape.push(k);
                let x = randn(&shape, n * 7 + k);
                let w = randn(&[n, k], n + k);
                let b = with_bias.then(|| randn(&[n], n));
                let ours = tch::no_grad(|| linear(&x, &w, b.as_ref())).expect("the kernel applies");
                let exact = x.to_kind(Kind::Double).linear(&w.to_kind(Kind::Double), b.map(|b| b.to_kind(Kind::Double)).as_ref());
                assert_eq!(ours.size(), exact.size());
                let err = (ours.to_kind(Kind::Double) - &exact).abs().max().double_value(&[]);
                assert!(err < 1e-4 * (k as f64).sqrt(), "{lead:?} x [{n}, {k}] bias {with_bias}: off by {err}");
                checked += 1;
            }
        }
        assert_eq!(checked, 12);
    }

    /// It stays out of training (autograd needs libtorch's op), of float64 and of many rows.
    #[test]
    fn autograd_other_kinds_and_many_rows_keep_libtorch() {
        let w = randn(&[16, 8], 1).set_requires_grad(true);
        let x = randn(&[2, 8], 2);
        assert!(linear(&x, &w, None).is_none(), "grad mode with a trainable weight");
        let y = x.linear(&w, None::<&Tensor>);
        assert!(y.requires_grad());
        assert!(linear(&x.to_kind(Kind::Double), &w.to_kind(Kind::Double), None).is_none());
        assert!(tch::no_grad(|| linear(&randn(&[MAX_ROWS + 1, 8], 3), &w, None)).is_none());
        assert_eq!(tch::no_grad(|| linear(&x, &w, None)).is_some(), enabled());
    }
}
