//! Device selection among the backends compiled into this binary.

use burn::tensor::Device;
pub use ember_llm::Precision;
use std::fmt;

/// A backend this binary may run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// burn's pure-Rust CPU backend (`flex`).
    Cpu,
    /// NVIDIA CUDA.
    Cuda,
    /// wgpu: Vulkan, Metal, DX12 or WebGPU.
    Wgpu,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
            Self::Wgpu => "wgpu",
        })
    }
}

/// The backends compiled in, in order of preference (GPUs first).
pub fn compiled_backends() -> Vec<BackendKind> {
    let mut v = Vec::new();
    if cfg!(feature = "cuda") {
        v.push(BackendKind::Cuda);
    }
    if cfg!(feature = "wgpu") {
        v.push(BackendKind::Wgpu);
    }
    if cfg!(feature = "cpu") {
        v.push(BackendKind::Cpu);
    }
    v
}

/// Error for a backend that was asked for but not compiled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendNotCompiled {
    /// What was asked for.
    pub requested: String,
    /// What this binary has.
    pub available: Vec<BackendKind>,
}

impl fmt::Display for BackendNotCompiled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.available.iter().map(ToString::to_string).collect();
        write!(
            f,
            "backend `{}` is not compiled into this binary (available: {}); rebuild with \
             `--features {}`",
            self.requested,
            names.join(", "),
            self.requested
        )
    }
}

impl std::error::Error for BackendNotCompiled {}

/// The backend `name` (`cpu`, `cuda`, `wgpu` or `auto`) selects in this binary.
pub fn kind(name: &str) -> Result<BackendKind, BackendNotCompiled> {
    let available = compiled_backends();
    let kind = match name {
        "auto" => available.first().copied(),
        "cpu" => available.iter().copied().find(|k| *k == BackendKind::Cpu),
        "cuda" => available.iter().copied().find(|k| *k == BackendKind::Cuda),
        "wgpu" => available.iter().copied().find(|k| *k == BackendKind::Wgpu),
        _ => None,
    };
    kind.ok_or_else(|| BackendNotCompiled {
        requested: name.to_string(),
        available,
    })
}

/// The precision a run gets on `backend` when it asks for `requested`, with a message when it
/// differs or deserves a note: WGSL has no bf16 type, so wgpu falls back to f32; on the CPU
/// bf16 is emulated (each product converts to f32 and back), so it is allowed for checking the
/// path but is slower than f32, the CPU default.
pub fn resolve_precision(
    requested: Precision,
    backend: BackendKind,
) -> (Precision, Option<String>) {
    match (requested, backend) {
        (Precision::Bf16, BackendKind::Wgpu) => (
            Precision::F32,
            Some(
                "precision = \"bf16\" was asked for, but the wgpu backend runs WGSL shaders, which \
                 have no bf16 type: running in f32 instead"
                    .into(),
            ),
        ),
        (Precision::Bf16, BackendKind::Cpu) => (
            Precision::Bf16,
            Some(
                "precision = \"bf16\" on the CPU backend: bf16 products are emulated and slower \
                 than f32 (the CPU default); use it to check the mixed-precision path"
                    .into(),
            ),
        ),
        (p, _) => (p, None),
    }
}

/// The device for `name` (`cpu`, `cuda`, `wgpu`, or `auto` for the first compiled backend).
pub fn device(name: &str) -> Result<Device, BackendNotCompiled> {
    match kind(name)? {
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => Ok(Device::flex()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Device::cuda(0)),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => Ok(Device::wgpu(Default::default())),
        #[allow(unreachable_patterns)]
        _ => Err(BackendNotCompiled {
            requested: name.to_string(),
            available: compiled_backends(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_falls_back_to_f32_on_wgpu_only() {
        let (p, note) = resolve_precision(Precision::Bf16, BackendKind::Wgpu);
        assert_eq!(p, Precision::F32);
        assert!(note.unwrap().contains("no bf16 type"));
        assert_eq!(
            resolve_precision(Precision::Bf16, BackendKind::Cuda),
            (Precision::Bf16, None)
        );
        let (p, note) = resolve_precision(Precision::Bf16, BackendKind::Cpu);
        assert_eq!(p, Precision::Bf16);
        assert!(note.unwrap().contains("emulated"));
        assert_eq!(
            resolve_precision(Precision::F32, BackendKind::Wgpu),
            (Precision::F32, None)
        );
    }

    #[test]
    fn unknown_backend_names_the_available_ones() {
        let e = kind("tpu").unwrap_err();
        assert!(e.to_string().contains("`tpu` is not compiled"), "{e}");
    }
}
