//! The multi-process world at the binary's edge (`ember train --dist`): the launcher's
//! environment read, the engine started (MPI or NCCL, as built), and the error path that ends
//! every rank at once.

use anyhow::{Result, bail};
use ember_dist::{Launch, World};

/// The world `--dist` asks for: `auto` (a launcher with several ranks in the environment forms
/// one over the engine this binary has), `none` (one process, whatever the environment says),
/// `mpi`, `nccl`. `None`: a single process.
pub fn open(dist: &str) -> Result<Option<World>> {
    if dist == "none" {
        return Ok(None);
    }
    if !["auto", "mpi", "nccl"].contains(&dist) {
        bail!("--dist {dist:?}: expected auto, none, mpi or nccl");
    }
    let launch = Launch::from_env()?;
    if launch.size == 1 {
        if dist != "auto" {
            log::info!("--dist {dist}: the environment describes one process");
        }
        return Ok(None);
    }
    let timeout = ember_collectives::timeout_from_env(ember_collectives::DEFAULT_TIMEOUT)
        .map_err(anyhow::Error::msg)?;
    let engine = match dist {
        "auto" if launch.launcher.has_mpi() => "mpi",
        "auto" => "nccl",
        d => d,
    };
    // The model's GPU is the rank's own (NCCL's communicator takes the same one).
    ember::common::device::use_rank_gpu(launch.gpu());
    start(engine, launch, timeout)
}

#[cfg(feature = "mpi")]
fn start_mpi(launch: Launch, timeout: std::time::Duration) -> Result<Option<World>> {
    if launch.launcher == ember_dist::Launcher::Torchrun {
        bail!(
            "torchrun starts processes without MPI; launch with mpirun (or srun --mpi=pmix), or \
             use --dist nccl on GPUs"
        );
    }
    Ok(Some(World::new(ember_collectives::mpi(timeout)?, launch)?))
}

#[cfg(not(feature = "mpi"))]
fn start_mpi(launch: Launch, _: std::time::Duration) -> Result<Option<World>> {
    bail!(
        "{} started {} processes, but this binary has no MPI: build it with `cargo build \
         --release --features mpi` (Debian: apt-get install libopenmpi-dev libclang-dev), or \
         pass --dist none to run each process alone",
        launch.launcher.name(),
        launch.size
    )
}

#[cfg(feature = "nccl")]
fn start_nccl(launch: Launch, timeout: std::time::Duration) -> Result<Option<World>> {
    Ok(Some(World::new(
        ember_collectives::nccl(&launch, timeout)?,
        launch,
    )?))
}

#[cfg(not(feature = "nccl"))]
fn start_nccl(launch: Launch, _: std::time::Duration) -> Result<Option<World>> {
    bail!(
        "{} started {} processes; NCCL needs a CUDA build (`--features cuda`), and on CPUs \
         launch with mpirun and a binary built with `--features mpi`",
        launch.launcher.name(),
        launch.size
    )
}

fn start(engine: &str, launch: Launch, timeout: std::time::Duration) -> Result<Option<World>> {
    match engine {
        "mpi" => start_mpi(launch, timeout),
        _ => start_nccl(launch, timeout),
    }
}
