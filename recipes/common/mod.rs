//! What every recipe kind shares below them: the compute device and precision (`device`), the
//! recipe parsing helpers (`config`), the GPU kernel cache (`kernel_cache`) and the glibc heap
//! settings (`heap`).

pub mod config;
pub mod device;
pub mod heap;
pub mod kernel_cache;
