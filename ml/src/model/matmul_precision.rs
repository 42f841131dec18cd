//! TensorFloat-32 matrix products on CUDA, for `dtype = "tf32"`: float32 weights and
//! activations, with cuBLAS products that round their inputs to TF32's 10-bit mantissa and
//! accumulate in float32 (PyTorch's `torch.backends.cuda.matmul.allow_tf32 = True`). Why: float32
//! products on an H100 run on the CUDA cores (about 67 TFLOP/s) and TF32 ones on the tensor cores
//! (about 495), so float32 σ scoring and large-batch float32 rollouts are compute-bound where TF32
//! is not, while bf16 moves log-probabilities by far more (bench/results/gpu.json). The CPU has no
//! TF32: its products are unchanged by the flag.
//!
//! tch binds no setter for this flag, and PyTorch's environment override
//! (`TORCH_ALLOW_TF32_CUBLAS_OVERRIDE`) is read once per process, which a warm stage process
//! serving one stage in tf32 and the next in f32 cannot use. So `at::Context::setAllowTF32CuBLAS`
//! is called by its C++ symbol, exported by libtorch_cpu (which tch links) since PyTorch 1.7: a
//! member function of the global context, taking the context as its first argument (the Itanium
//! C++ ABI of every Linux target). Since PyTorch 2.9 it also sets the newer per-backend precision
//! to match, so the two never disagree.

use std::ffi::c_void;

extern "C" {
    #[link_name = "_ZN2at13globalContextEv"]
    fn at_global_context() -> *mut c_void;
    #[link_name = "_ZN2at7Context18setAllowTF32CuBLASEb"]
    fn at_context_set_allow_tf32_cublas(context: *mut c_void, allow: bool);
    /// Returns `at::Float32MatmulPrecision`: HIGHEST = 0 (float32 throughout), HIGH = 1 (TF32
    /// allowed), MEDIUM = 2.
    #[link_name = "_ZNK2at7Context22float32MatmulPrecisionEv"]
    fn at_context_float32_matmul_precision(context: *const c_void) -> i32;
}

/// Turns TF32 cuBLAS products on or off for this process (every CUDA float32 product from now on).
pub fn set_cuda_matmul_tf32(on: bool) {
    // SAFETY: `at::globalContext()` returns a reference to a static that lives for the process;
    // the setter stores two fields of it and throws for neither value.
    unsafe { at_context_set_allow_tf32_cublas(at_global_context(), on) }
}

/// Whether CUDA float32 products may use TF32 now (PyTorch's float32 matmul precision is not
/// "highest").
pub fn cuda_matmul_tf32() -> bool {
    // SAFETY: as above; the getter throws only when the legacy and the per-backend flags
    // disagree, which the legacy setter never leaves them in.
    unsafe { at_context_float32_matmul_precision(at_global_context()) != 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DeviceChoice, DtypeChoice, LoadOptions};
    use tch::Device;

    /// One test: the flag is one per process, and tests run side by side.
    #[test]
    fn tf32_is_set_for_cuda_models_only_and_every_other_dtype_clears_it() {
        set_cuda_matmul_tf32(true);
        assert!(cuda_matmul_tf32());
        set_cuda_matmul_tf32(false);
        assert!(!cuda_matmul_tf32());

        let opts = |dtype| LoadOptions { device: DeviceChoice::Auto, dtype };
        let err = opts(DtypeChoice::Tf32).apply_matmul_precision(Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("dtype = tf32") && err.contains("CPU"), "{err}");
        for dtype in [DtypeChoice::Auto, DtypeChoice::F32, DtypeChoice::Bf16] {
            set_cuda_matmul_tf32(true);
            opts(dtype).apply_matmul_precision(Device::Cpu).unwrap();
            assert!(!cuda_matmul_tf32(), "{dtype:?} leaves float32 products");
        }
        if tch::Cuda::is_available() {
            opts(DtypeChoice::Tf32).apply_matmul_precision(Device::Cuda(0)).unwrap();
            assert!(cuda_matmul_tf32());
            opts(DtypeChoice::F32).apply_matmul_precision(Device::Cuda(0)).unwrap();
            assert!(!cuda_matmul_tf32());
        }
    }
}
