//! The world over MPI (the `mpi` crate: Open MPI or MPICH).
//!
//! One thread owns MPI (`MPI_THREAD_FUNNELED`: the thread that initialised it is the only one
//! that calls it; `engine.rs`). Every operation is:
//! 1. a check-in: each rank sends `(operation number, step)` to rank 0, which answers "go" once
//!    every rank has come, or, at the timeout, prints the ranks that did not come and calls
//!    `MPI_Abort` (which ends every process, the stalled one too). A rank whose numbers differ
//!    from rank 0's is named as diverged. Ranks other than 0 wait a little longer than rank 0,
//!    so that rank 0's diagnosis comes first;
//! 2. the collective itself, non-blocking, tested until done or the timeout (a rank that died
//!    or stalled during it). Then rank 0 pings every rank: the ranks that wait (in a collective
//!    or for "go") answer, so the ones that do not are named.

use crate::engine::{Engine, OnThread};
use ember_dist::{At, Collective, DistError};
use mpi::collective::{CommunicatorCollectives, Root, SystemOperation};
use mpi::datatype::PartitionMut;
use mpi::environment::Universe;
use mpi::point_to_point::{Destination, Source};
use mpi::request::{Request, Scope, scope};
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::{Count, Threading};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CHECK_IN: i32 = 7001;
const GO: i32 = 7002;
const PING: i32 = 7003;
const PONG: i32 = 7004;

/// How long rank 0 waits for the answers to its pings before it names the silent ranks.
const PING_GRACE: Duration = Duration::from_secs(3);

/// The world over MPI (`MPI_COMM_WORLD`), started by `mpirun`, `mpiexec` or `srun --mpi=…`:
/// MPI initialised on a thread of its own; each collective then waits at most `timeout` for the
/// other ranks.
///
/// # Errors
/// MPI was initialised already, or its thread could not start.
pub fn mpi(timeout: Duration) -> Result<Arc<dyn Collective>, DistError> {
    let on = OnThread::start("mpi", move || {
        let Some((universe, _)) = mpi::initialize_with_threading(Threading::Funneled) else {
            return Err(DistError::Engine {
                engine: "mpi",
                what: "initialisation",
                step: 0,
                message: "MPI was initialised already in this process".into(),
            });
        };
        Ok(MpiEngine {
            world: universe.world(),
            _universe: universe,
            timeout,
            seq: 0,
        })
    })?;
    Ok(Arc::new(on))
}

/// MPI's world on its thread.
struct MpiEngine {
    world: SimpleCommunicator,
    /// Finalises MPI when dropped (after `world`).
    _universe: Universe,
    timeout: Duration,
    /// Operations so far (the same on every rank).
    seq: u64,
}

impl MpiEngine {
    fn watched(&mut self) -> (Watched<'_>, u64) {
        self.seq += 1;
        let w = Watched {
            world: &self.world,
            timeout: self.timeout,
        };
        (w, self.seq)
    }
}

impl Engine for MpiEngine {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn size(&self) -> usize {
        self.world.size() as usize
    }

    fn sum(&mut self, v: Vec<f32>, at: At) -> Result<Vec<f32>, DistError> {
        let (w, seq) = self.watched();
        w.check_in(seq, at, v.len());
        Ok(w.sum(&v, at))
    }

    fn gather(&mut self, b: Vec<u8>, at: At) -> Result<Vec<Vec<u8>>, DistError> {
        let (w, seq) = self.watched();
        w.check_in(seq, at, 0);
        Ok(w.gather(&b, at))
    }

    fn broadcast(&mut self, b: Vec<u8>, at: At) -> Result<Vec<u8>, DistError> {
        let (w, seq) = self.watched();
        w.check_in(seq, at, 0);
        Ok(w.broadcast(b, at))
    }

    fn abort(&mut self, code: i32) -> ! {
        self.world.abort(code)
    }
}

/// `MPI_COMM_WORLD` with the watchdog's timeout.
struct Watched<'a> {
    world: &'a SimpleCommunicator,
    timeout: Duration,
}

impl Watched<'_> {
    /// Prints why the world ends and ends it (`MPI_Abort` ends every rank's process).
    fn die(&self, msg: &str) -> ! {
        eprintln!(
            "Error: distributed run, rank {} of {}: {msg}; every rank stops now (the last \
             checkpoint is intact: continue with --resume)",
            self.world.rank(),
            self.world.size()
        );
        self.world.abort(3)
    }

    /// Tests `req` until it completes; at `deadline`, `why()` is the error.
    fn finish<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        req: Request<'a, D, S>,
        deadline: Instant,
        why: impl Fn() -> String,
    ) {
        self.poll(req, deadline, || self.die(&why()));
    }

    /// Tests `req` until it completes (answering rank 0's pings meanwhile); at `deadline`,
    /// `expire` (which ends the process).
    fn poll<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        mut req: Request<'a, D, S>,
        deadline: Instant,
        expire: impl Fn(),
    ) {
        let mut spins = 0u32;
        loop {
            match req.test() {
                Ok(_) => return,
                Err(r) => req = r,
            }
            if Instant::now() > deadline {
                expire();
            }
            spins += 1;
            if spins > 200 {
                std::thread::sleep(Duration::from_micros(100));
            }
            if spins.is_multiple_of(64) {
                self.answer_ping();
            }
        }
    }

    /// A rank other than 0 that waits answers rank 0's ping (rank 0 is naming the silent ones).
    fn answer_ping(&self) {
        if self.world.rank() == 0 {
            return;
        }
        let zero = self.world.process_at_rank(0);
        if zero.immediate_probe_with_tag(PING).is_some() {
            let (msg, _) = zero.receive_with_tag::<u64>(PING);
            zero.send_with_tag(&msg, PONG);
        }
    }

    /// Rank 0, at a collective's timeout: pings every rank, then names those that do not
    /// answer within [`PING_GRACE`] and ends the world. Other ranks: rank 0 is the silent one.
    fn name_silent(&self, at: At) -> ! {
        let secs = self.timeout.as_secs_f64();
        if self.world.rank() != 0 {
            self.die(&format!(
                "{at} did not complete within {secs:.0} s, and rank 0, which names the missing \
                 ranks, did not either: rank 0 stalled or died"
            ));
        }
        let size = self.world.size() as usize;
        let ping = [1u64];
        let mut pongs = vec![0u64; size];
        scope(|s| {
            let _sends: Vec<_> = (1..size)
                .map(|k| {
                    let p = self.world.process_at_rank(k as i32);
                    p.immediate_send_with_tag(s, &ping, PING)
                })
                .collect();
            let mut pending: Vec<(usize, Request<'_, u64, _>)> = pongs
                .iter_mut()
                .enumerate()
                .skip(1)
                .map(|(k, b)| {
                    let p = self.world.process_at_rank(k as i32);
                    (k, p.immediate_receive_into_with_tag(s, b, PONG))
                })
                .collect();
            let until = Instant::now() + PING_GRACE;
            while !pending.is_empty() && Instant::now() < until {
                pending = pending
                    .into_iter()
                    .filter_map(|(k, r)| r.test().err().map(|r| (k, r)))
                    .collect();
                std::thread::sleep(Duration::from_millis(1));
            }
            let silent: Vec<String> = pending.iter().map(|(k, _)| k.to_string()).collect();
            match silent.is_empty() {
                true => self.die(&format!(
                    "{at} did not complete within {secs:.0} s, though every rank answers"
                )),
                false => self.die(&format!(
                    "rank(s) {} stopped inside {at} (no answer within {secs:.0} s: stalled or \
                     dead)",
                    silent.join(", ")
                )),
            }
        })
    }

    /// Step 1 of every operation (see the module's comment).
    fn check_in(&self, seq: u64, at: At, len: usize) {
        // The operation's name and a sum's length travel too: ranks at the same count of
        // operations but in different ones (or summing buffers of different lengths) are told
        // apart before MPI meets mismatched collectives.
        let me = [seq, at.step as u64, name_hash(at.what), len as u64];
        let size = self.world.size();
        let started = Instant::now();
        if self.world.rank() == 0 {
            let mut got = vec![[0u64; 4]; size as usize];
            let deadline = started + self.timeout;
            scope(|s| {
                let mut pending: Vec<(i32, Request<'_, [u64; 4], _>)> = got
                    .iter_mut()
                    .enumerate()
                    .skip(1)
                    .map(|(k, buf)| {
                        let p = self.world.process_at_rank(k as i32);
                        (
                            k as i32,
                            p.immediate_receive_into_with_tag(s, buf, CHECK_IN),
                        )
                    })
                    .collect();
                let mut spins = 0u32;
                while !pending.is_empty() {
                    let mut still = Vec::with_capacity(pending.len());
                    for (k, r) in pending {
                        if let Err(r) = r.test() {
                            still.push((k, r));
                        }
                    }
                    pending = still;
                    if !pending.is_empty() && Instant::now() > deadline {
                        let names: Vec<String> =
                            pending.iter().map(|(k, _)| k.to_string()).collect();
                        self.die(&format!(
                            "rank(s) {} did not reach {at} within {:.0} s (stalled or dead)",
                            names.join(", "),
                            self.timeout.as_secs_f64()
                        ));
                    }
                    spins += 1;
                    if spins > 200 {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
            });
            for (k, g) in got.iter().enumerate().skip(1) {
                if *g != me {
                    self.die(&format!(
                        "rank {k} is at operation {} of step {} (another operation or length: \
                         {g:?}) but rank 0 at operation {} of step {} ({at}): the ranks ran \
                         different programs",
                        g[0], g[1], me[0], me[1]
                    ));
                }
            }
            let go = [seq];
            scope(|s| {
                let sends: Vec<_> = (1..size)
                    .map(|k| {
                        let p = self.world.process_at_rank(k);
                        p.immediate_send_with_tag(s, &go, GO)
                    })
                    .collect();
                for r in sends {
                    self.finish(r, deadline, || format!("rank 0 could not send go for {at}"));
                }
            });
        } else {
            // Longer than rank 0's wait, so that rank 0 names a missing third rank first.
            let deadline =
                started + self.timeout + self.timeout / 10 + Duration::from_secs(5) + PING_GRACE;
            let mut go = [0u64];
            scope(|s| {
                let zero = self.world.process_at_rank(0);
                let send = zero.immediate_send_with_tag(s, &me, CHECK_IN);
                let recv = zero.immediate_receive_into_with_tag(s, &mut go, GO);
                let why = || format!("rank 0 did not answer at {at} (stalled or dead)");
                self.finish(send, deadline, why);
                self.finish(recv, deadline, why);
            });
            if go[0] != seq {
                self.die(&format!(
                    "rank 0 is at operation {} but this rank at {seq} ({at}): the ranks ran \
                     different programs",
                    go[0]
                ));
            }
        }
    }

    /// [`finish`](Self::finish) for a collective: at the deadline the silent ranks are named.
    fn finish_or_name<'a, D: ?Sized, S: Scope<'a>>(
        &self,
        req: Request<'a, D, S>,
        deadline: Instant,
        at: At,
    ) {
        self.poll(req, deadline, || self.name_silent(at));
    }

    /// A collective's deadline: the timeout on rank 0; longer elsewhere, so that rank 0, which
    /// names the silent ranks, speaks first.
    fn deadline(&self) -> Instant {
        let now = Instant::now() + self.timeout;
        match self.world.rank() {
            0 => now,
            _ => now + self.timeout / 10 + Duration::from_secs(5) + PING_GRACE,
        }
    }

    fn sum(&self, v: &[f32], at: At) -> Vec<f32> {
        let mut out = vec![0f32; v.len()];
        let deadline = self.deadline();
        scope(|s| {
            let r =
                self.world
                    .immediate_all_reduce_into(s, v, &mut out[..], SystemOperation::sum());
            self.finish_or_name(r, deadline, at);
        });
        out
    }

    fn gather(&self, b: &[u8], at: At) -> Vec<Vec<u8>> {
        let size = self.world.size() as usize;
        let deadline = self.deadline();
        let Ok(mine) = Count::try_from(b.len()) else {
            self.die(&format!("{at}: {} bytes are more than MPI counts", b.len()));
        };
        let mut counts = vec![0 as Count; size];
        scope(|s| {
            let r = self
                .world
                .immediate_all_gather_into(s, &mine, &mut counts[..]);
            self.finish_or_name(r, deadline, at);
        });
        let mut displs = Vec::with_capacity(size);
        let mut total: Count = 0;
        for c in &counts {
            displs.push(total);
            total = match total.checked_add(*c) {
                Some(t) => t,
                None => self.die(&format!("{at}: the ranks' parts exceed MPI's counts")),
            };
        }
        let mut all = vec![0u8; total as usize];
        let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
        scope(|s| {
            let r = self
                .world
                .immediate_all_gather_varcount_into(s, b, &mut part);
            self.finish_or_name(r, deadline, at);
        });
        counts
            .iter()
            .zip(&displs)
            .map(|(c, d)| all[*d as usize..(*d + *c) as usize].to_vec())
            .collect()
    }

    fn broadcast(&self, mut b: Vec<u8>, at: At) -> Vec<u8> {
        let deadline = self.deadline();
        let root = self.world.process_at_rank(0);
        let mut len = b.len() as u64;
        scope(|s| {
            let r = root.immediate_broadcast_into(s, &mut len);
            self.finish_or_name(r, deadline, at);
        });
        if len > u64::from(u32::MAX) {
            self.die(&format!("{at}: rank 0 announced {len} bytes"));
        }
        b.resize(len as usize, 0);
        scope(|s| {
            let r = root.immediate_broadcast_into(s, &mut b[..]);
            self.finish_or_name(r, deadline, at);
        });
        b
    }
}

/// FNV-1a of an operation's name (the same on every rank).
fn name_hash(what: &str) -> u64 {
    what.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
