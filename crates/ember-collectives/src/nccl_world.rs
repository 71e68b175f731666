//! The world over NCCL (through cudarc, NCCL loaded at run time), for GPU ranks started by
//! `torchrun` or `srun`: one rank per GPU, the device chosen by the local rank (or the one GPU
//! the launcher left visible: `Launch::gpu`, which the model's device follows too). Rank 0 makes
//! NCCL's unique id and hands it to every rank through Ember's rendezvous (`ember_dist::
//! rendezvous`, on its own port beside torchrun's store); `Comm::from_rank` then forms the
//! communicator.
//!
//! The buffers a step exchanges are the host's (the gradients come flattened from the
//! trainer, as over MPI): each is copied to the device, reduced by NCCL on a stream of its own,
//! and copied back. NCCL's calls have no timeout of their own, so each is followed by an event
//! that is polled until the timeout; past it the process says which operation of which step
//! did not complete and exits, and the launcher (torchrun's agent, Slurm) ends the other ranks.
//! NCCL cannot say which rank is missing; the MPI engine can.

use crate::engine::{Engine, OnThread};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DriverError};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::safe::{Comm, Id, ReduceOp};
use ember_dist::{At, Collective, DistError, Launch, rendezvous};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The world over NCCL for the rank `launch` describes; each collective waits at most `timeout`.
///
/// # Errors
/// No CUDA device for the local rank, the rendezvous failed, or NCCL did not form the world.
pub fn nccl(launch: &Launch, timeout: Duration) -> Result<Arc<dyn Collective>, DistError> {
    let launch = launch.clone();
    let on = OnThread::start("nccl", move || NcclEngine::new(&launch, timeout))?;
    Ok(Arc::new(on))
}

/// NCCL's communicator on its thread.
struct NcclEngine {
    comm: Comm,
    stream: Arc<CudaStream>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

fn init_error(message: String) -> DistError {
    DistError::Engine {
        engine: "nccl",
        what: "initialisation",
        step: 0,
        message,
    }
}

impl NcclEngine {
    fn new(launch: &Launch, timeout: Duration) -> Result<Self, DistError> {
        let gpu = launch.gpu();
        let ctx =
            CudaContext::new(gpu).map_err(|e| init_error(format!("CUDA device {gpu}: {e:?}")))?;
        let stream = ctx.new_stream().map_err(|e| init_error(format!("{e:?}")))?;
        let mine = match launch.rank {
            0 => Id::new().map_err(|e| init_error(format!("ncclGetUniqueId: {e:?}")))?,
            _ => Id::uninit([0; 128]),
        };
        let bytes: Vec<u8> = mine.internal().iter().map(|c| *c as u8).collect();
        let got = rendezvous::exchange(launch, &bytes, timeout)?;
        let mut internal = [0 as std::ffi::c_char; 128];
        if got.len() != internal.len() {
            return Err(init_error(format!(
                "rank 0 sent an id of {} bytes",
                got.len()
            )));
        }
        for (d, s) in internal.iter_mut().zip(&got) {
            *d = *s as std::ffi::c_char;
        }
        let comm = Comm::from_rank(
            stream.clone(),
            launch.rank,
            launch.size,
            Id::uninit(internal),
        )
        .map_err(|e| init_error(format!("ncclCommInitRank: {e:?}")))?;
        Ok(Self {
            comm,
            stream,
            rank: launch.rank,
            size: launch.size,
            timeout,
        })
    }

    /// Waits for the stream's work up to the timeout; past it, says which operation did not
    /// complete and exits (the launcher ends the other ranks).
    fn wait(&self, at: At) -> Result<(), DistError> {
        let event = self.stream.record_event(None).map_err(|e| driver(at, &e))?;
        let deadline = Instant::now() + self.timeout;
        while !event.try_is_complete().map_err(|e| driver(at, &e))? {
            if Instant::now() > deadline {
                eprintln!(
                    "Error: distributed run, rank {} of {}: {at} did not complete within {:.0} \
                     s (a rank stalled or died; NCCL does not say which); this rank stops now \
                     (the last checkpoint is intact: continue with --resume)",
                    self.rank,
                    self.size,
                    self.timeout.as_secs_f64()
                );
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn to_device<T: cudarc::driver::DeviceRepr>(
        &self,
        v: &[T],
        at: At,
    ) -> Result<CudaSlice<T>, DistError> {
        self.stream.clone_htod(v).map_err(|e| driver(at, &e))
    }

    fn to_host<T: cudarc::driver::DeviceRepr + Default + Clone>(
        &self,
        d: &CudaSlice<T>,
        at: At,
    ) -> Result<Vec<T>, DistError> {
        self.stream.clone_dtoh(d).map_err(|e| driver(at, &e))
    }

    /// `v` replaced by rank 0's `v` (the same length on every rank: each broadcasts the length
    /// first).
    fn broadcast_u64(&self, v: u64, at: At) -> Result<u64, DistError> {
        let mut d = self.to_device(&[v], at)?;
        self.comm
            .broadcast_in_place(&mut d, 0)
            .map_err(|e| nccl_error(at, &e))?;
        self.wait(at)?;
        Ok(self.to_host(&d, at)?[0])
    }
}

fn driver(at: At, e: &DriverError) -> DistError {
    failed(at, format!("CUDA: {e:?}"))
}

fn nccl_error(at: At, e: &NcclError) -> DistError {
    failed(at, format!("{e:?}"))
}

fn failed(at: At, message: String) -> DistError {
    DistError::Engine {
        engine: "nccl",
        what: at.what,
        step: at.step,
        message,
    }
}

impl Engine for NcclEngine {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn sum(&mut self, v: Vec<f32>, at: At) -> Result<Vec<f32>, DistError> {
        let mut d = self.to_device(&v, at)?;
        self.comm
            .all_reduce_in_place(&mut d, &ReduceOp::Sum)
            .map_err(|e| nccl_error(at, &e))?;
        self.wait(at)?;
        self.to_host(&d, at)
    }

    fn gather(&mut self, b: Vec<u8>, at: At) -> Result<Vec<Vec<u8>>, DistError> {
        // The lengths first, then every part padded to the longest.
        let lens = self.to_device(&[b.len() as u64], at)?;
        let mut all_lens = self.to_device(&vec![0u64; self.size], at)?;
        self.comm
            .all_gather(&lens, &mut all_lens)
            .map_err(|e| nccl_error(at, &e))?;
        self.wait(at)?;
        let lens = self.to_host(&all_lens, at)?;
        let longest = lens.iter().copied().max().unwrap_or(0).max(1);
        let longest = usize::try_from(longest).map_err(|_| nccl_len(at, longest))?;
        let mut mine = b;
        mine.resize(longest, 0);
        let send = self.to_device(&mine, at)?;
        let total = longest
            .checked_mul(self.size)
            .ok_or_else(|| nccl_len(at, longest as u64))?;
        let mut recv = self.to_device(&vec![0u8; total], at)?;
        self.comm
            .all_gather(&send, &mut recv)
            .map_err(|e| nccl_error(at, &e))?;
        self.wait(at)?;
        let all = self.to_host(&recv, at)?;
        Ok(all
            .chunks(longest)
            .zip(&lens)
            .map(|(c, n)| c[..(*n as usize).min(longest)].to_vec())
            .collect())
    }

    fn broadcast(&mut self, b: Vec<u8>, at: At) -> Result<Vec<u8>, DistError> {
        let len = self.broadcast_u64(b.len() as u64, at)?;
        let len = usize::try_from(len).map_err(|_| nccl_len(at, len))?;
        let mut mine = b;
        mine.resize(len.max(1), 0);
        let mut d = self.to_device(&mine, at)?;
        self.comm
            .broadcast_in_place(&mut d, 0)
            .map_err(|e| nccl_error(at, &e))?;
        self.wait(at)?;
        let mut out = self.to_host(&d, at)?;
        out.truncate(len);
        Ok(out)
    }

    fn abort(&mut self, code: i32) -> ! {
        // torchrun's agent (or Slurm) ends the other ranks when one exits with an error.
        std::process::exit(code)
    }
}

fn nccl_len(at: At, n: u64) -> DistError {
    failed(at, format!("a rank announced {n} bytes"))
}
