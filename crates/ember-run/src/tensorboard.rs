//! TensorBoard event files, written live: `tensorboard/events.out.tfevents.*` in the run
//! directory, one scalar per metric per step and text summaries (sampled completions), readable
//! by TensorBoard, `tbparse` and W&B's `sync_tensorboard`.
//!
//! The format (TensorFlow's `tensorflow/core/util/event.proto`, `summary.proto`, framed as
//! TFRecords: `tensorflow/core/lib/io/record_writer.cc`) is small enough to write by hand: a
//! record is `u64 length, u32 masked CRC-32C of the length, data, u32 masked CRC-32C of the data`
//! (little-endian), and each datum is an `Event` protobuf. No crate was used for the protobuf:
//! the maintained TensorBoard writers for Rust pull a protobuf runtime and an image stack for
//! five message types of which Ember writes four fields each; CRC-32C comes from the `crc32c`
//! crate (hardware-accelerated).

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The directory of the event file inside a run directory.
pub const DIR: &str = "tensorboard";

/// TFRecord's CRC mask (`tensorflow/core/lib/hash/crc32c.h`, `Mask`).
fn masked_crc(data: &[u8]) -> u32 {
    let c = crc32c::crc32c(data);
    c.rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord frame around `data`.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend(len);
    out.extend(masked_crc(&len).to_le_bytes());
    out.extend(data);
    out.extend(masked_crc(data).to_le_bytes());
    out
}

/// Protobuf encoding helpers (wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32).
fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(field: u32, wire: u32, out: &mut Vec<u8>) {
    varint(u64::from(field << 3 | wire), out);
}

fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
    key(field, 2, out);
    varint(b.len() as u64, out);
    out.extend(b);
}

/// `Event { wall_time = 1 (double), step = 2 (int64), <body> }`.
fn event(wall_time: f64, step: i64, body: &[u8]) -> Vec<u8> {
    let mut e = Vec::with_capacity(body.len() + 20);
    key(1, 1, &mut e);
    e.extend(wall_time.to_le_bytes());
    key(2, 0, &mut e);
    varint(step as u64, &mut e);
    e.extend(body);
    e
}

/// `Event.summary = 5`: `Summary { value = 1 (repeated Value) }` of scalars, each
/// `Value { tag = 1, simple_value = 2 (float) }`.
fn scalars_body<'a>(values: impl Iterator<Item = (&'a str, f64)>) -> Vec<u8> {
    let mut summary = Vec::new();
    for (tag, v) in values {
        let mut value = Vec::new();
        bytes_field(1, tag.as_bytes(), &mut value);
        key(2, 5, &mut value);
        value.extend((v as f32).to_le_bytes());
        bytes_field(1, &value, &mut summary);
    }
    let mut body = Vec::new();
    bytes_field(5, &summary, &mut body);
    body
}

/// `Event.summary = 5` holding one text summary: `Value { tag = 1, metadata = 9
/// (SummaryMetadata { plugin_data = 1 (PluginData { plugin_name = 1: "text" }) }), tensor = 8
/// (TensorProto { dtype = 1: DT_STRING (7), tensor_shape = 2: scalar, string_val = 8 }) }`.
fn text_body(tag: &str, text: &str) -> Vec<u8> {
    let mut plugin = Vec::new();
    bytes_field(1, b"text", &mut plugin);
    let mut metadata = Vec::new();
    bytes_field(1, &plugin, &mut metadata);
    let mut tensor = Vec::new();
    key(1, 0, &mut tensor);
    varint(7, &mut tensor);
    bytes_field(2, &[], &mut tensor);
    bytes_field(8, text.as_bytes(), &mut tensor);
    let mut value = Vec::new();
    bytes_field(1, tag.as_bytes(), &mut value);
    bytes_field(8, &tensor, &mut value);
    bytes_field(9, &metadata, &mut value);
    let mut summary = Vec::new();
    bytes_field(1, &value, &mut summary);
    let mut body = Vec::new();
    bytes_field(5, &summary, &mut body);
    body
}

/// `Event.file_version = 3`, the first event of every file.
fn file_version_body() -> Vec<u8> {
    let mut body = Vec::new();
    bytes_field(3, b"brain.Event:2", &mut body);
    body
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The step of an encoded `Event` (field 2), if it has one.
fn event_step(mut e: &[u8]) -> Option<i64> {
    fn read_varint(b: &mut &[u8]) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = b.split_first()?;
            *b = rest;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
    while !e.is_empty() {
        let k = read_varint(&mut e)?;
        let (field, wire) = (k >> 3, k & 7);
        match wire {
            0 => {
                let v = read_varint(&mut e)?;
                if field == 2 {
                    return Some(v as i64);
                }
            }
            1 => e = e.get(8..)?,
            5 => e = e.get(4..)?,
            2 => {
                let n = usize::try_from(read_varint(&mut e)?).ok()?;
                e = e.get(n..)?;
            }
            _ => return None,
        }
    }
    None
}

/// The bytes of the whole, well-framed records of `data` whose event step is at most `last`
/// (up to the first later step, or a torn last record: a failed append leaves a prefix of one
/// record at the end). A damaged record with the file going on after it is an error naming its
/// byte offset: cutting there would silently drop the valid history behind it.
fn kept_prefix(data: &[u8], last: i64) -> Result<usize, String> {
    let damaged =
        |at: usize, what: &str| Err(format!("the record at byte {at} is damaged ({what})"));
    let mut at = 0usize;
    loop {
        let Some(header) = data.get(at..at + 12) else {
            return Ok(at);
        };
        let (len_bytes, crc) = header.split_at(8);
        let len_arr: [u8; 8] = len_bytes.try_into().unwrap_or([0; 8]);
        if crc != masked_crc(&len_arr).to_le_bytes() {
            return damaged(at, "its length's checksum");
        }
        let crc_end = usize::try_from(u64::from_le_bytes(len_arr))
            .ok()
            .and_then(|n| at.checked_add(16)?.checked_add(n));
        let Some(crc_end) = crc_end.filter(|&e| e <= data.len()) else {
            return Ok(at);
        };
        let (body, crc) = data[at + 12..crc_end].split_at(crc_end - 4 - (at + 12));
        if crc != masked_crc(body).to_le_bytes() {
            return damaged(at, "its body's checksum");
        }
        if event_step(body).unwrap_or(0) > last {
            return Ok(at);
        }
        at = crc_end;
    }
}

/// The live event file of a run.
pub struct EventWriter {
    file: std::fs::File,
    path: PathBuf,
}

impl EventWriter {
    /// Opens the run's event file: a new one (any older file of the directory removed), or, when
    /// resuming after step `keep_until`, the existing one cut after that step's records (so that
    /// it holds exactly what `metrics.jsonl` holds).
    pub fn open(run_dir: &Path, keep_until: Option<usize>) -> Result<Self> {
        let dir = run_dir.join(DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut existing: Vec<PathBuf> = std::fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().contains("tfevents"))
            })
            .collect();
        existing.sort();
        if let (Some(last), Some(path)) = (keep_until, existing.last()) {
            let data =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let keep =
                kept_prefix(&data, i64::try_from(last).unwrap_or(i64::MAX)).map_err(|e| {
                    anyhow::anyhow!(
                        "{}: {e}; resuming would drop the TensorBoard history after it. Move the \
                         tensorboard directory away to resume with a new event file \
                         (metrics.jsonl keeps every step)",
                        path.display()
                    )
                })?;
            let file = std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))?;
            file.set_len(keep as u64)
                .with_context(|| format!("truncating {}", path.display()))?;
            return Ok(Self {
                file,
                path: path.clone(),
            });
        }
        for p in &existing {
            std::fs::remove_file(p).with_context(|| format!("removing {}", p.display()))?;
        }
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "ember".into());
        let host: String = host
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        let path = dir.join(format!(
            "events.out.tfevents.{}.{host}.{}",
            now() as u64,
            std::process::id()
        ));
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = Self { file, path };
        w.write(&event(now(), 0, &file_version_body()))?;
        Ok(w)
    }

    fn write(&mut self, event: &[u8]) -> Result<()> {
        // One write per record: a failure leaves at most a torn last record, which TensorBoard
        // ignores and resuming cuts.
        self.file
            .write_all(&record(event))
            .and_then(|()| self.file.flush())
            .with_context(|| format!("appending to {}", self.path.display()))
    }

    /// One event holding a scalar per metric of `row` at `step` (the `step` key itself is the
    /// event's step, not a scalar).
    pub fn scalars(
        &mut self,
        step: i64,
        row: &std::collections::BTreeMap<String, f64>,
    ) -> Result<()> {
        let body = scalars_body(
            row.iter()
                .filter(|(k, _)| k.as_str() != "step")
                .map(|(k, v)| (k.as_str(), *v)),
        );
        self.write(&event(now(), step, &body))
    }

    /// A text summary (TensorBoard's Text tab) at `step`.
    pub fn text(&mut self, step: i64, tag: &str, text: &str) -> Result<()> {
        self.write(&event(now(), step, &text_body(tag, text)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C check value (RFC 3720 B.4: 32 zero bytes → 0x8a9136aa) and TFRecord's mask.
    #[test]
    fn crc_and_mask() {
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8a91_36aa);
        // ((c >> 15) | (c << 17)) + 0xa282ead8, worked out by hand.
        assert_eq!(masked_crc(&[0u8; 32]), 0x0fd7_fffa);
    }

    #[test]
    fn varints_and_steps() {
        let mut v = Vec::new();
        varint(300, &mut v);
        assert_eq!(v, [0xac, 0x02]);
        let e = event(1.5, 1234, &scalars_body([("a/b", 0.5)].into_iter()));
        assert_eq!(event_step(&e), Some(1234));
    }

    /// Resuming keeps the records up to the step and drops later and torn ones; damage in the
    /// middle is an error naming its offset.
    #[test]
    fn kept_prefix_cuts_after_the_step() {
        let mut data = record(&event(0.0, 0, &file_version_body()));
        let mut ends = vec![data.len()];
        for s in 1..=4 {
            data.extend(record(&event(
                0.0,
                s,
                &scalars_body([("x", 1.0)].into_iter()),
            )));
            ends.push(data.len());
        }
        assert_eq!(kept_prefix(&data, 2), Ok(ends[2]));
        assert_eq!(kept_prefix(&data, 9), Ok(ends[4]));
        // A torn last record (a failed append), body or header: dropped.
        assert_eq!(kept_prefix(&data[..ends[4] - 3], 9), Ok(ends[3]));
        assert_eq!(kept_prefix(&data[..ends[3] + 5], 9), Ok(ends[3]));
        // A flipped bit with records after it: named, not cut.
        let mut bad = data.clone();
        bad[ends[1] + 14] ^= 1;
        let e = kept_prefix(&bad, 9).unwrap_err();
        assert!(
            e.contains(&format!("byte {}", ends[1])) && e.contains("body"),
            "{e}"
        );
        let mut bad = data.clone();
        bad[ends[2] + 9] ^= 1;
        assert!(kept_prefix(&bad, 9).unwrap_err().contains("length"));
        // Damage behind a later step is cut with the later records.
        let mut bad = data.clone();
        bad[ends[3] + 14] ^= 1;
        assert_eq!(kept_prefix(&bad, 2), Ok(ends[2]));
    }
}
