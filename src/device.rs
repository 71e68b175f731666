//! Device selection among the backends compiled into this binary.

use burn::tensor::Device;
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

/// The device for `name` (`cpu`, `cuda`, `wgpu`, or `auto` for the first compiled backend).
pub fn device(name: &str) -> Result<Device, BackendNotCompiled> {
    let available = compiled_backends();
    let kind = match name {
        "auto" => available.first().copied(),
        "cpu" => available.iter().copied().find(|k| *k == BackendKind::Cpu),
        "cuda" => available.iter().copied().find(|k| *k == BackendKind::Cuda),
        "wgpu" => available.iter().copied().find(|k| *k == BackendKind::Wgpu),
        _ => None,
    };
    let not_compiled = || BackendNotCompiled {
        requested: name.to_string(),
        available: available.clone(),
    };
    match kind.ok_or_else(not_compiled)? {
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => Ok(Device::flex()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Device::cuda(0)),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => Ok(Device::wgpu(Default::default())),
        #[allow(unreachable_patterns)]
        _ => Err(not_compiled()),
    }
}
