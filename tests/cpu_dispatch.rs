//! The same release binary runs where AVX-512 is absent. burn-flex's GEMM is built with the
//! `x86-v4` feature (AVX-512 kernels) but chooses its kernels at run time; `ember info` run
//! under QEMU's user-mode emulator with a Haswell CPU model (AVX2 and FMA, no AVX-512) must
//! report no AVX-512 and pass its matrix-product check against a host loop. Skips with a
//! message when `qemu-x86_64` is not installed (`.ci/run` installs Debian's `qemu-user`).

use std::process::Command;

#[test]
fn runs_without_avx512_under_qemu() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let out = match Command::new("qemu-x86_64")
        .args(["-cpu", "Haswell", env!("CARGO_BIN_EXE_ember"), "info"])
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            eprintln!("skipped: qemu-x86_64 is not available ({e}); apt-get install qemu-user");
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "ember info failed without AVX-512: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("avx512f no"), "{text}");
    assert!(text.contains("avx2 yes"), "{text}");
    let err: f64 = text
        .split("max |error| ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::INFINITY);
    assert!(err < 1e-3, "matrix product error {err} without AVX-512");
}
