//! The collectives a training step needs and the handle jobs hold.

use crate::error::DistError;
use crate::launch::Launch;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where a collective is called: the step and the operation, named in every error and by the
/// watchdog ("rank 1 did not reach the gradient sum of step 3").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct At {
    /// The step (1-based, as the progress line counts; 0 before the first).
    pub step: usize,
    /// The operation.
    pub what: &'static str,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            0 => write!(f, "the {} before the first step", self.what),
            s => write!(f, "the {} of step {s}", self.what),
        }
    }
}

/// What a training step asks of the engine under the world (MPI, NCCL). Every rank calls the
/// same operations in the same order. An implementation bounds each call by a timeout and, where
/// a rank does not arrive, ends every process with an error naming that rank and the [`At`]
/// (a collective that waits for ever is the failure this exists to prevent).
pub trait Collective: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Processes in the world.
    fn size(&self) -> usize;
    /// The engine's name (`mpi`, `nccl`).
    fn engine(&self) -> &'static str;
    /// `buf` replaced by its sum over the ranks (the same bits on every rank).
    ///
    /// # Errors
    /// The engine's own error.
    fn all_reduce_sum(&self, buf: Vec<f32>, at: At) -> Result<Vec<f32>, DistError>;
    /// Every rank's `bytes`, in rank order.
    ///
    /// # Errors
    /// The engine's own error.
    fn all_gather(&self, bytes: Vec<u8>, at: At) -> Result<Vec<Vec<u8>>, DistError>;
    /// Rank 0's `bytes` on every rank (the others' are ignored).
    ///
    /// # Errors
    /// The engine's own error.
    fn broadcast(&self, bytes: Vec<u8>, at: At) -> Result<Vec<u8>, DistError>;
    /// Ends the world after an error on this rank: the other ranks are stopped at once instead
    /// of waiting for this one until their timeout (MPI's `MPI_Abort`).
    fn abort(&self, code: i32) -> !;
}

/// Bytes per broadcast call (1 GiB).
pub const BROADCAST_PIECE: usize = 1 << 30;

/// Floats per all-reduce call: gradients are summed in buckets of this many (64 MiB), so that
/// the engine's buffers stay bounded whatever the model's size.
pub const BUCKET: usize = 16 << 20;

/// The multi-process world as a job holds it: cheap to clone, shared by the optimizer and the
/// run directory.
#[derive(Clone)]
pub struct World {
    comm: Arc<dyn Collective>,
    launch: Arc<Launch>,
    step: Arc<AtomicUsize>,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("World")
            .field("engine", &self.comm.engine())
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl World {
    /// The world of `comm`, whose rank and size must be the launcher's.
    ///
    /// # Errors
    /// The engine's world is not the one the launcher described.
    pub fn new(comm: Arc<dyn Collective>, launch: Launch) -> Result<Self, DistError> {
        if (comm.rank(), comm.size()) != (launch.rank, launch.size) {
            return Err(DistError::Inconsistent {
                launcher: launch.launcher.name(),
                what: format!(
                    "it says rank {} of {}, but {} formed rank {} of {} (was the binary \
                     started by a different launcher than the one whose variables it sees?)",
                    launch.rank,
                    launch.size,
                    comm.engine(),
                    comm.rank(),
                    comm.size()
                ),
            });
        }
        Ok(Self {
            comm,
            launch: Arc::new(launch),
            step: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Processes in the world.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Rank 0, the one writer of the run directory.
    pub fn is_writer(&self) -> bool {
        self.rank() == 0
    }

    /// The engine's name.
    pub fn engine(&self) -> &'static str {
        self.comm.engine()
    }

    /// What the launcher said.
    pub fn launch(&self) -> &Launch {
        &self.launch
    }

    /// The step named by the collectives that follow (1-based).
    pub fn set_step(&self, step: usize) {
        self.step.store(step, Ordering::Relaxed);
    }

    fn at(&self, what: &'static str) -> At {
        At {
            step: self.step.load(Ordering::Relaxed),
            what,
        }
    }

    /// This rank's part of `0..n`: contiguous, sizes differing by at most one, the first ranks
    /// taking the remainder's places in order (empty where `n` < size).
    pub fn shard(&self, n: usize) -> Range<usize> {
        let (k, s) = (self.rank(), self.size());
        k * n / s..(k + 1) * n / s
    }

    /// `buf` summed over the ranks, in buckets of [`BUCKET`] floats.
    ///
    /// # Errors
    /// The engine's own error.
    pub fn sum(&self, buf: Vec<f32>, what: &'static str) -> Result<Vec<f32>, DistError> {
        let at = self.at(what);
        if buf.len() <= BUCKET {
            return self.comm.all_reduce_sum(buf, at);
        }
        let mut out = Vec::with_capacity(buf.len());
        for chunk in buf.chunks(BUCKET) {
            out.extend(self.comm.all_reduce_sum(chunk.to_vec(), at)?);
        }
        Ok(out)
    }

    /// Whether `flag` holds on any rank.
    ///
    /// # Errors
    /// The engine's own error.
    pub fn any(&self, flag: bool, what: &'static str) -> Result<bool, DistError> {
        Ok(self.sum(vec![f32::from(u8::from(flag))], what)?[0] > 0.0)
    }

    /// Every rank's `bytes`, in rank order.
    ///
    /// # Errors
    /// The engine's own error.
    pub fn gather(&self, bytes: Vec<u8>, what: &'static str) -> Result<Vec<Vec<u8>>, DistError> {
        self.comm.all_gather(bytes, self.at(what))
    }

    /// Rank 0's `bytes` on every rank: the length first, then pieces of at most
    /// [`BROADCAST_PIECE`] bytes (MPI counts are 32-bit; a full model's weights exceed them).
    ///
    /// # Errors
    /// The engine's own error, or a length that does not fit this machine.
    pub fn broadcast(&self, bytes: Vec<u8>, what: &'static str) -> Result<Vec<u8>, DistError> {
        let at = self.at(what);
        let len = self
            .comm
            .broadcast((bytes.len() as u64).to_le_bytes().to_vec(), at)?;
        let len = <[u8; 8]>::try_from(len.as_slice())
            .ok()
            .and_then(|b| usize::try_from(u64::from_le_bytes(b)).ok())
            .ok_or_else(|| DistError::Engine {
                engine: self.engine(),
                what,
                step: at.step,
                message: "rank 0 announced a length this rank cannot hold".into(),
            })?;
        if len <= BROADCAST_PIECE {
            return self.comm.broadcast(bytes, at);
        }
        let mut out = Vec::with_capacity(len);
        for start in (0..len).step_by(BROADCAST_PIECE) {
            let end = (start + BROADCAST_PIECE).min(len);
            let piece = bytes
                .get(start..end)
                .map(<[u8]>::to_vec)
                .unwrap_or_default();
            out.extend(self.comm.broadcast(piece, at)?);
        }
        Ok(out)
    }

    /// Every rank's `floats`, in rank order (sent as little-endian bytes, so NaN and infinities
    /// travel as they are).
    ///
    /// # Errors
    /// The engine's own error, or a rank's part that is not whole floats.
    pub fn gather_floats(
        &self,
        floats: &[f32],
        what: &'static str,
    ) -> Result<Vec<Vec<f32>>, DistError> {
        let parts = self.gather(to_bytes(floats), what)?;
        parts.iter().map(|p| self.floats_of(p, what)).collect()
    }

    /// Rank 0's `floats` on every rank (the others' are ignored).
    ///
    /// # Errors
    /// The engine's own error, or a message that is not whole floats.
    pub fn broadcast_floats(
        &self,
        floats: &[f32],
        what: &'static str,
    ) -> Result<Vec<f32>, DistError> {
        let bytes = self.broadcast(to_bytes(floats), what)?;
        self.floats_of(&bytes, what)
    }

    fn floats_of(&self, bytes: &[u8], what: &'static str) -> Result<Vec<f32>, DistError> {
        if !bytes.len().is_multiple_of(4) {
            return Err(DistError::Engine {
                engine: self.engine(),
                what,
                step: self.at(what).step,
                message: format!("a rank sent {} bytes, not whole floats", bytes.len()),
            });
        }
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// Ends every process of the world after an error on this one (see
    /// [`Collective::abort`]).
    pub fn abort(&self, code: i32) -> ! {
        self.comm.abort(code)
    }
}

fn to_bytes(floats: &[f32]) -> Vec<u8> {
    floats.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A world whose other ranks hold fixed values: checks the bucketing and the shards.
    struct Fake {
        rank: usize,
        size: usize,
        calls: Mutex<Vec<usize>>,
    }

    impl Collective for Fake {
        fn rank(&self) -> usize {
            self.rank
        }
        fn size(&self) -> usize {
            self.size
        }
        fn engine(&self) -> &'static str {
            "fake"
        }
        fn all_reduce_sum(&self, buf: Vec<f32>, _: At) -> Result<Vec<f32>, DistError> {
            self.calls.lock().unwrap().push(buf.len());
            Ok(buf.into_iter().map(|x| x * self.size as f32).collect())
        }
        fn all_gather(&self, bytes: Vec<u8>, _: At) -> Result<Vec<Vec<u8>>, DistError> {
            Ok(vec![bytes; self.size])
        }
        fn broadcast(&self, bytes: Vec<u8>, _: At) -> Result<Vec<u8>, DistError> {
            Ok(bytes)
        }
        fn abort(&self, code: i32) -> ! {
            std::process::exit(code)
        }
    }

    fn world(rank: usize, size: usize) -> (World, Arc<Fake>) {
        let fake = Arc::new(Fake {
            rank,
            size,
            calls: Mutex::new(Vec::new()),
        });
        let launch = Launch {
            rank,
            size,
            local_size: size,
            ..Launch::single()
        };
        (World::new(fake.clone(), launch).unwrap(), fake)
    }

    #[test]
    fn shards_cover_the_rows_once_in_order() {
        for n in [0, 1, 5, 8, 13] {
            let mut all = Vec::new();
            for k in 0..3 {
                all.extend(world(k, 3).0.shard(n));
            }
            assert_eq!(all, (0..n).collect::<Vec<_>>());
        }
        assert_eq!(world(1, 3).0.shard(5), 1..3);
    }

    #[test]
    fn sums_go_in_buckets_and_come_back_whole() {
        let (w, fake) = world(0, 2);
        let n = BUCKET * 2 + 3;
        let out = w.sum(vec![1.5; n], "test").unwrap();
        assert_eq!(out.len(), n);
        assert!(out.iter().all(|x| *x == 3.0));
        assert_eq!(*fake.calls.lock().unwrap(), vec![BUCKET, BUCKET, 3]);
    }

    #[test]
    fn a_world_the_launcher_did_not_describe_is_refused() {
        let fake = Arc::new(Fake {
            rank: 0,
            size: 1,
            calls: Mutex::new(Vec::new()),
        });
        let launch = Launch {
            rank: 1,
            size: 2,
            local_size: 2,
            ..Launch::single()
        };
        let e = World::new(fake, launch).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 of 2") && e.contains("rank 0 of 1"),
            "{e}"
        );
    }

    /// Floats cross as they are, NaN and infinities included; a part of stray bytes is refused.
    #[test]
    fn floats_cross_whole() {
        let (w, _) = world(0, 2);
        let v = [1.5, f32::NAN, f32::NEG_INFINITY, -0.0];
        let parts = w.gather_floats(&v, "test").unwrap();
        assert_eq!(parts.len(), 2);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&parts[1]), bits(&v));
        assert_eq!(bits(&w.broadcast_floats(&v, "test").unwrap()), bits(&v));
        let e = w.floats_of(&[1, 2, 3], "test").unwrap_err().to_string();
        assert!(e.contains("3 bytes, not whole floats"), "{e}");
    }

    #[test]
    fn the_step_is_named() {
        let at = At {
            step: 3,
            what: "gradient sum",
        };
        assert_eq!(at.to_string(), "the gradient sum of step 3");
    }
}
