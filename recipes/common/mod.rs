//! What every recipe kind shares below them: the compute device and precision (`device`), the
//! recipe parsing helpers (`config`), the GPU kernel cache (`kernel_cache`), the
//! keys that took a new name (`renamed`), the glibc heap
//! settings (`heap`) and the one set-up of a job's run directory (`run`).

pub mod config;
pub mod device;
pub mod heap;
pub mod kernel_cache;
pub mod renamed;
pub mod run;
