//! Device selection among the backends compiled into this binary.

use burn::tensor::Device;
use ember_train::Precision;
use ember_train::{DataParallel, Reduce};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

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

/// The first CUDA device this process uses: 0, or a multi-process rank's own GPU
/// ([`use_rank_gpu`]).
static FIRST_CUDA: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A rank of a multi-process run takes GPU `index` (its local rank, or 0 where the launcher
/// made one GPU visible): `cuda` is then `cuda:index`, and `[data_parallel]`'s devices follow it.
pub fn use_rank_gpu(index: usize) {
    FIRST_CUDA.store(index, std::sync::atomic::Ordering::Relaxed);
}

/// The device for `name` (`cpu`, `cuda`, `wgpu`, or `auto` for the first compiled backend).
pub fn device(name: &str) -> Result<Device, BackendNotCompiled> {
    match kind(name)? {
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => Ok(Device::flex()),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Device::cuda(
            FIRST_CUDA.load(std::sync::atomic::Ordering::Relaxed),
        )),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => Ok(Device::wgpu(Default::default())),
        #[allow(unreachable_patterns)]
        _ => Err(BackendNotCompiled {
            requested: name.to_string(),
            available: compiled_backends(),
        }),
    }
}

/// `[data_parallel]` of a recipe: the update's mini-batches sharded over `devices` devices of
/// the backend (`ember_train::DataParallel`); generation and evaluation stay on the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataParallelSpec {
    /// How many devices (1: no data parallelism, unless `reduce = "all_reduce"`). CUDA: `cuda:0`
    /// … `cuda:N-1`; CPU: N replicas on the one CPU device, as `cpu_shards`.
    #[serde(default = "crate::common::config::defaults::one")]
    pub devices: usize,
    /// On the CPU backend, how many shards of each mini-batch run at once, each in its own
    /// thread on the one CPU device (ignored on GPU backends). burn's CPU kernels run their
    /// products on every core but their element-wise work on the calling thread, so a second
    /// shard's element-wise work fills the cores the first leaves idle.
    #[serde(default = "crate::common::config::defaults::one")]
    pub cpu_shards: usize,
    /// `auto` (burn's NCCL `all_reduce` on CUDA, `gather` elsewhere), `gather` or `all_reduce`.
    #[serde(default)]
    pub reduce: Reduce,
}

impl Default for DataParallelSpec {
    fn default() -> Self {
        Self {
            devices: 1,
            cpu_shards: 1,
            reduce: Reduce::Auto,
        }
    }
}

/// The most devices (or CPU replicas) one data-parallel group takes.
pub const MAX_DEVICES: usize = 256;

impl DataParallelSpec {
    /// One device and the default reduction (left out of resolved recipes).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }

    /// `devices` in 1..=[`MAX_DEVICES`] (a huge count would allocate per replica at start).
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.devices == 0 {
            anyhow::bail!("data_parallel.devices must be at least 1");
        }
        if self.devices > MAX_DEVICES {
            anyhow::bail!(
                "data_parallel.devices = {} must be at most {MAX_DEVICES}",
                self.devices
            );
        }
        if !(1..=MAX_DEVICES).contains(&self.cpu_shards) {
            anyhow::bail!(
                "data_parallel.cpu_shards = {} must be in 1..={MAX_DEVICES}",
                self.cpu_shards
            );
        }
        Ok(())
    }
}

/// Why a data-parallel group cannot be formed on this machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataParallelError {
    /// A count of 0 (the key named).
    #[error("data_parallel.{0} must be at least 1")]
    Zero(&'static str),
    /// Both replica counts set on the CPU.
    #[error(
        "data_parallel.devices = {devices} and data_parallel.cpu_shards = {cpu_shards}: on the CPU \
         both count replicas of the one CPU device; set one of them"
    )]
    CpuTwice {
        /// `devices`.
        devices: usize,
        /// `cpu_shards`.
        cpu_shards: usize,
    },
    /// More devices asked for than the backend has.
    #[error("data_parallel.devices = {asked}, but the {backend} backend has {found} device(s)")]
    TooFew {
        /// Asked for.
        asked: usize,
        /// Present.
        found: usize,
        /// The backend.
        backend: BackendKind,
    },
    /// `all_reduce` on a backend without a collective.
    #[error(
        "data_parallel.reduce = \"all_reduce\" needs a collective, which burn 0.22 provides on \
         CUDA only (NCCL); the {0} backend has none: use reduce = \"gather\" (or \"auto\")"
    )]
    NoCollective(BackendKind),
    /// wgpu.
    #[error(
        "data-parallel training on wgpu is not supported: burn 0.22 has no wgpu collective and \
         Ember does not enumerate wgpu adapters; use data_parallel.devices = 1 or the cuda backend"
    )]
    Wgpu,
    /// The backend is not compiled in.
    #[error("{0}")]
    Backend(String),
    /// The trainer refused the group.
    #[error(transparent)]
    Group(#[from] ember_train::ParallelError),
}

/// The data-parallel group of `spec` on backend `name` (`None` for one device); its first device
/// is `device(name)?.autodiff()`, the training device of every job.
pub fn data_parallel(
    name: &str,
    spec: DataParallelSpec,
) -> Result<Option<Arc<DataParallel>>, DataParallelError> {
    if spec.devices == 0 {
        return Err(DataParallelError::Zero("devices"));
    }
    if spec.cpu_shards == 0 {
        return Err(DataParallelError::Zero("cpu_shards"));
    }
    let backend = kind(name).map_err(|e| DataParallelError::Backend(e.to_string()))?;
    let replicas = match backend {
        BackendKind::Cpu => cpu_replicas(spec)?,
        _ => spec.devices,
    };
    // One device takes no group, unless `all_reduce` is asked for explicitly: a group of one
    // still runs the collective path (the check a single-GPU machine can make).
    if replicas == 1 && spec.reduce != Reduce::AllReduce {
        return Ok(None);
    }
    let (devices, reduce) = match backend {
        BackendKind::Wgpu => return Err(DataParallelError::Wgpu),
        BackendKind::Cpu => {
            if spec.reduce == Reduce::AllReduce {
                return Err(DataParallelError::NoCollective(backend));
            }
            let d = device(name)
                .map_err(|e| DataParallelError::Backend(e.to_string()))?
                .autodiff();
            (vec![d; replicas], Reduce::Gather)
        }
        BackendKind::Cuda => cuda_devices(spec)?,
    };
    Ok(Some(Arc::new(DataParallel::new(devices, reduce)?)))
}

/// The replicas of the one CPU device: `devices` or `cpu_shards`, whichever is set.
fn cpu_replicas(spec: DataParallelSpec) -> Result<usize, DataParallelError> {
    match (spec.devices, spec.cpu_shards) {
        (d, 1) => Ok(d),
        (1, s) => Ok(s),
        (devices, cpu_shards) => Err(DataParallelError::CpuTwice {
            devices,
            cpu_shards,
        }),
    }
}

#[cfg(feature = "cuda")]
fn cuda_devices(spec: DataParallelSpec) -> Result<(Vec<Device>, Reduce), DataParallelError> {
    let found = Device::enumerate(burn::tensor::DeviceType::Cuda)
        .into_vec()
        .len();
    let first = FIRST_CUDA.load(std::sync::atomic::Ordering::Relaxed);
    if found < first + spec.devices {
        return Err(DataParallelError::TooFew {
            asked: first + spec.devices,
            found,
            backend: BackendKind::Cuda,
        });
    }
    let devices = (first..first + spec.devices)
        .map(|i| Device::cuda(i).autodiff())
        .collect();
    let reduce = match spec.reduce {
        Reduce::Auto => Reduce::AllReduce,
        r => r,
    };
    Ok((devices, reduce))
}

#[cfg(not(feature = "cuda"))]
fn cuda_devices(spec: DataParallelSpec) -> Result<(Vec<Device>, Reduce), DataParallelError> {
    Err(DataParallelError::TooFew {
        asked: spec.devices,
        found: 0,
        backend: BackendKind::Cuda,
    })
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
    fn cpu_shards_count_replicas_of_the_cpu() {
        let spec = |devices, cpu_shards| DataParallelSpec {
            devices,
            cpu_shards,
            reduce: Reduce::Auto,
        };
        assert_eq!(cpu_replicas(spec(1, 1)), Ok(1));
        assert_eq!(cpu_replicas(spec(1, 2)), Ok(2));
        assert_eq!(cpu_replicas(spec(3, 1)), Ok(3));
        let e = cpu_replicas(spec(2, 2)).unwrap_err();
        assert!(e.to_string().contains("set one of them"), "{e}");
        assert!(spec(1, 0).validate().is_err());
        assert!(spec(1, MAX_DEVICES + 1).validate().is_err());
        assert!(spec(1, 2).validate().is_ok());
        assert!(!spec(1, 2).is_default());
    }

    #[test]
    fn unknown_backend_names_the_available_ones() {
        let e = kind("tpu").unwrap_err();
        assert!(e.to_string().contains("`tpu` is not compiled"), "{e}");
    }
}
