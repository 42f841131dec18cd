//! Which CPU kernels ATen runs (`torch.backends.cpu.get_cpu_capability()`), recorded in every ML
//! stage's run record: the same inputs give bitwise the same artifacts under the same kernels on
//! any machine, and other numbers under others (AVX2 and AVX-512 kernels round differently; README,
//! "Across hosts"). `ATEN_CPU_CAPABILITY=avx2` lowers an AVX-512 CPU to AVX2's. tch binds no call
//! for it: `ml/csrc/cpu_capability.cpp` calls libtorch's `at::get_cpu_capability`.

use std::ffi::{c_char, c_int, CStr};

extern "C" {
    fn rr_cpu_capability(out: *mut c_char, size: c_int) -> c_int;
}

/// ATen's CPU kernel set ("AVX2", "AVX512", "DEFAULT", ...), `None` if libtorch could not say.
pub fn cpu_capability() -> Option<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the shim writes at most `buf.len()` bytes, NUL-terminated, and catches every C++
    // exception.
    let rc = unsafe { rr_cpu_capability(buf.as_mut_ptr(), buf.len() as c_int) };
    // SAFETY: on success the buffer holds a NUL-terminated string.
    (rc == 0).then(|| unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a child process (ATen reads ATEN_CPU_CAPABILITY once per process), the kernel set
    /// `value` gives, as this test prints it there.
    fn in_child(value: Option<&str>) -> String {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["aten_kernels::tests::the_kernel_set_is_atens_own", "--exact", "--nocapture", "--test-threads=1"])
            .env("RR_PRINT_CPU_CAPABILITY", "1")
            .env_remove("ATEN_CPU_CAPABILITY");
        if let Some(v) = value {
            cmd.env("ATEN_CPU_CAPABILITY", v);
        }
        let out = String::from_utf8(cmd.output().unwrap().stdout).unwrap();
        // The harness prints the test's name on the same line.
        let at = out.find("CPU_CAPABILITY=").unwrap_or_else(|| panic!("no answer: {out}"));
        out[at + "CPU_CAPABILITY=".len()..].split_whitespace().next().unwrap_or_default().to_string()
    }

    #[test]
    fn the_kernel_set_is_atens_own() {
        let name = cpu_capability().expect("libtorch names its kernel set");
        if std::env::var("RR_PRINT_CPU_CAPABILITY").is_ok() {
            println!("CPU_CAPABILITY={name}");
            return;
        }
        assert_eq!(in_child(Some("default")), "DEFAULT");
        let native = in_child(None);
        assert!(["DEFAULT", "AVX2", "AVX512"].contains(&native.as_str()), "x86-64 kernels: {native}");
        if native == "AVX512" {
            assert_eq!(in_child(Some("avx2")), "AVX2");
        }
    }
}
