//! The rendezvous that hands every rank the bytes rank 0 made (NCCL's unique id): rank 0 listens
//! on `addr`, every other rank connects, says its rank and world size, and reads the bytes.
//! Each side gives up at a deadline with an error naming the ranks it did not hear from.
//!
//! torchrun's agent already listens on `MASTER_PORT` (its own store), so Ember's rendezvous
//! takes `EMBER_RDZV_PORT`, or `MASTER_PORT + 1` ([`port`]).

use crate::error::DistError;
use crate::launch::Launch;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The port when neither `EMBER_RDZV_PORT` nor `MASTER_PORT` is set (torchrun's default + 1).
pub const DEFAULT_PORT: u16 = 29501;

/// Largest payload accepted (NCCL's id is 128 bytes).
const MAX_PAYLOAD: u32 = 1 << 16;

/// Ember's rendezvous port: `EMBER_RDZV_PORT`, else `MASTER_PORT + 1`, else [`DEFAULT_PORT`].
///
/// # Errors
/// `EMBER_RDZV_PORT` that is not a port number.
pub fn port(launch: &Launch) -> Result<u16, DistError> {
    match std::env::var("EMBER_RDZV_PORT") {
        Ok(v) => v.trim().parse().map_err(|_| DistError::BadVar {
            name: "EMBER_RDZV_PORT",
            value: v,
            launcher: "Ember",
        }),
        Err(_) => Ok(launch
            .master_port
            .and_then(|p| p.checked_add(1))
            .unwrap_or(DEFAULT_PORT)),
    }
}

/// Rank 0's `payload` on every rank (rank 0 gets its own back).
///
/// # Errors
/// No master address, a socket error, a peer that says another world, or ranks not heard from
/// by the deadline (named).
pub fn exchange(launch: &Launch, payload: &[u8], timeout: Duration) -> Result<Vec<u8>, DistError> {
    let host = launch
        .master
        .as_deref()
        .ok_or_else(|| DistError::Rendezvous {
            addr: "?".into(),
            what: "no address for rank 0: set MASTER_ADDR".into(),
        })?;
    let addr = format!("{host}:{}", port(launch)?);
    let fail = |what: String| DistError::Rendezvous {
        addr: addr.clone(),
        what,
    };
    let deadline = Instant::now() + timeout;
    if launch.rank == 0 {
        serve(launch, payload, &addr, deadline).map_err(fail)?;
        Ok(payload.to_vec())
    } else {
        fetch(launch, &addr, deadline).map_err(fail)
    }
}

fn serve(launch: &Launch, payload: &[u8], addr: &str, deadline: Instant) -> Result<(), String> {
    let bind = addr
        .to_socket_addrs()
        .map_err(|e| format!("resolving: {e}"))?
        .next()
        .ok_or("the address resolves to nothing")?;
    let listener = TcpListener::bind(("0.0.0.0", bind.port())).map_err(|e| format!("{e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut heard = vec![false; launch.size];
    heard[0] = true;
    while heard.iter().any(|h| !h) {
        if Instant::now() > deadline {
            let missing: Vec<String> = (0..launch.size)
                .filter(|k| !heard[*k])
                .map(|k| k.to_string())
                .collect();
            return Err(format!("rank(s) {} never connected", missing.join(", ")));
        }
        let mut stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        stream.set_nonblocking(false).map_err(|e| e.to_string())?;
        let left = deadline.saturating_duration_since(Instant::now());
        stream
            .set_read_timeout(Some(left.max(Duration::from_millis(100))))
            .map_err(|e| e.to_string())?;
        let mut hello = [0u8; 8];
        if stream.read_exact(&mut hello).is_err() {
            continue; // a stray connection
        }
        let (rank, size) = split(hello);
        if size != launch.size || rank == 0 || rank >= launch.size || heard[rank] {
            return Err(format!(
                "a peer said rank {rank} of {size}, in a world of {}",
                launch.size
            ));
        }
        let len = u32::try_from(payload.len()).map_err(|_| "payload too large")?;
        stream
            .write_all(&len.to_le_bytes())
            .and_then(|()| stream.write_all(payload))
            .map_err(|e| format!("answering rank {rank}: {e}"))?;
        heard[rank] = true;
    }
    Ok(())
}

fn fetch(launch: &Launch, addr: &str, deadline: Instant) -> Result<Vec<u8>, String> {
    let mut last = String::from("no attempt");
    while Instant::now() < deadline {
        let target = match addr.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(a)) => a,
            Ok(None) => return Err("the address resolves to nothing".into()),
            Err(e) => {
                last = format!("resolving: {e}");
                std::thread::sleep(Duration::from_millis(200));
                continue;
            }
        };
        match TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
            Ok(mut s) => {
                let left = deadline.saturating_duration_since(Instant::now());
                s.set_read_timeout(Some(left.max(Duration::from_millis(100))))
                    .map_err(|e| e.to_string())?;
                let hello = join(launch.rank, launch.size);
                s.write_all(&hello).map_err(|e| e.to_string())?;
                let mut len = [0u8; 4];
                s.read_exact(&mut len)
                    .map_err(|e| format!("rank 0 did not answer: {e}"))?;
                let len = u32::from_le_bytes(len);
                if len > MAX_PAYLOAD {
                    return Err(format!("rank 0 announced {len} bytes"));
                }
                let mut buf = vec![0u8; len as usize];
                s.read_exact(&mut buf).map_err(|e| e.to_string())?;
                return Ok(buf);
            }
            Err(e) => {
                last = e.to_string();
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
    Err(format!(
        "rank 0 was not reachable before the deadline ({last})"
    ))
}

fn join(rank: usize, size: usize) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&u32::try_from(rank).unwrap_or(u32::MAX).to_le_bytes());
    b[4..].copy_from_slice(&u32::try_from(size).unwrap_or(u32::MAX).to_le_bytes());
    b
}

fn split(b: [u8; 8]) -> (usize, usize) {
    let r = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let s = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    (r as usize, s as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launch::Launcher;

    fn launch(rank: usize, size: usize, port: u16) -> Launch {
        Launch {
            launcher: Launcher::Torchrun,
            rank,
            size,
            local_rank: rank,
            local_size: size,
            master: Some("127.0.0.1".into()),
            master_port: Some(port - 1),
        }
    }

    fn free_port() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    }

    #[test]
    fn every_rank_gets_rank_zeros_bytes() {
        let port = free_port();
        let t = Duration::from_secs(20);
        let others: Vec<_> = (1..3)
            .map(|k| std::thread::spawn(move || exchange(&launch(k, 3, port), b"zz", t)))
            .collect();
        let id: Vec<u8> = (0..128).collect();
        assert_eq!(exchange(&launch(0, 3, port), &id, t).unwrap(), id);
        for h in others {
            assert_eq!(h.join().unwrap().unwrap(), id);
        }
    }

    #[test]
    fn a_rank_that_never_comes_is_named() {
        let port = free_port();
        let e = exchange(&launch(0, 3, port), b"x", Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank(s) 1, 2 never connected"), "{e}");
        let e = exchange(&launch(2, 3, free_port()), b"x", Duration::from_millis(300))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 0 was not reachable"), "{e}");
    }
}
