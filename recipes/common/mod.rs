//! What every recipe kind shares below them: the compute device and precision (`device`), the
//! header every recipe starts with (`header`), the recipe parsing helpers and the training table
//! of every kind's loop (`config`), the keys that took a new name (`renamed`), the GPU kernel
//! cache (`kernel_cache`), the glibc heap settings (`heap`), the CPU's float mode
//! (`subnormals`) and the one set-up of a job's run directory (`run`).

pub mod config;
pub mod device;
pub mod header;
pub mod heap;
pub mod kernel_cache;
pub mod renamed;
pub mod run;
pub mod subnormals;
