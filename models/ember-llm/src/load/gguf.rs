//! A reader for GGUF files (llama.cpp's model format, version 2 and 3): header, metadata,
//! tensor directory, and dequantization of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K to f32.
//!
//! Block layouts follow ggml's `ggml-quants.c` (`dequantize_row_*`).

use half::{bf16, f16};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

pub use crate::error::GgufError;

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array.
    Array(Vec<Value>),
}

impl Value {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        match self {
            Value::U64(v) => Some(*v),
            Value::I64(v) => u64::try_from(*v).ok(),
            _ => None,
        }
    }
    /// The value as a float.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::F64(v) => Some(*v),
            Value::U64(v) => Some(*v as f64),
            Value::I64(v) => Some(*v as f64),
            _ => None,
        }
    }
    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
    /// The value as an array.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// GGML tensor types this reader knows by name.
pub fn ggml_type_name(t: u32) -> &'static str {
    match t {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        9 => "Q8_1",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        30 => "BF16",
        _ => "unknown",
    }
}

/// (elements per block, bytes per block) of a supported type.
fn block_layout(t: u32) -> Option<(usize, usize)> {
    Some(match t {
        0 => (1, 4),
        1 => (1, 2),
        30 => (1, 2),
        2 => (32, 18),
        3 => (32, 20),
        8 => (32, 34),
        12 => (256, 144),
        14 => (256, 210),
        _ => return None,
    })
}

/// One entry of the tensor directory.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// GGUF name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in GGUF order: `dims[0]` is the fastest-varying (a row's length).
    pub dims: Vec<u64>,
    /// GGML type id.
    pub ggml_type: u32,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Number of elements ([`GgufFile::open`] checked that the product fits).
    pub fn len(&self) -> usize {
        self.dims
            .iter()
            .try_fold(1usize, |n, d| n.checked_mul(usize::try_from(*d).ok()?))
            .unwrap_or(usize::MAX)
    }
    /// True for a tensor with no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Shape in row-major (PyTorch) order: the reverse of `dims`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|d| *d as usize).collect()
    }
}

/// An open GGUF file: metadata and tensor directory read, tensor data read on demand.
#[derive(Debug)]
pub struct GgufFile {
    path: PathBuf,
    /// Format version.
    pub version: u32,
    /// Metadata key/value pairs.
    pub metadata: BTreeMap<String, Value>,
    /// Tensor directory, in file order.
    pub tensors: Vec<TensorInfo>,
    data_start: u64,
}

struct Cursor<'a, R: Read> {
    r: &'a mut R,
    path: &'a Path,
    /// Bytes of the file not read yet: every length declared in the file is checked against
    /// it before anything is allocated for it.
    remaining: u64,
}

impl<R: Read> Cursor<'_, R> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N], GgufError> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b).map_err(|e| self.truncated(e))?;
        self.remaining = self.remaining.saturating_sub(N as u64);
        Ok(b)
    }
    /// A count of items of at least `min_bytes` each that the rest of the file can hold.
    fn count(&self, what: &str, n: u64, min_bytes: u64) -> Result<usize, GgufError> {
        if n.checked_mul(min_bytes).is_none_or(|b| b > self.remaining) {
            return Err(self.bad(format!(
                "{what} of {n} declared, more than the file's remaining {} bytes hold",
                self.remaining
            )));
        }
        usize::try_from(n).map_err(|_| self.bad(format!("{what} of {n}")))
    }
    fn truncated(&self, e: std::io::Error) -> GgufError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            GgufError::Format {
                path: self.path.to_path_buf(),
                reason: "truncated file".into(),
            }
        } else {
            GgufError::Io {
                path: self.path.to_path_buf(),
                source: e,
            }
        }
    }
    fn bad(&self, reason: impl Into<String>) -> GgufError {
        GgufError::Format {
            path: self.path.to_path_buf(),
            reason: reason.into(),
        }
    }
    fn u32(&mut self) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> Result<String, GgufError> {
        let len = self.u64()?;
        let len = self.count("a string", len, 1)?;
        let mut buf = vec![0u8; len];
        self.r.read_exact(&mut buf).map_err(|e| self.truncated(e))?;
        self.remaining = self.remaining.saturating_sub(len as u64);
        String::from_utf8(buf).map_err(|_| self.bad("a string is not UTF-8"))
    }
    fn value(&mut self, t: u32, depth: usize) -> Result<Value, GgufError> {
        Ok(match t {
            0 => Value::U64(u64::from(self.bytes::<1>()?[0])),
            1 => Value::I64(i64::from(self.bytes::<1>()?[0] as i8)),
            2 => Value::U64(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => Value::I64(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => Value::U64(u64::from(self.u32()?)),
            5 => Value::I64(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => Value::F64(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => Value::Bool(self.bytes::<1>()?[0] != 0),
            8 => Value::Str(self.string()?),
            9 => {
                if depth > 4 {
                    return Err(self.bad("arrays nested too deep"));
                }
                let inner = self.u32()?;
                let len = self.u64()?;
                let len = self.count("an array", len, 1)?;
                let mut v = Vec::with_capacity(len);
                for _ in 0..len {
                    v.push(self.value(inner, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64()?),
            11 => Value::I64(i64::from_le_bytes(self.bytes()?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes()?)),
            other => return Err(self.bad(format!("unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Reads the header, metadata and tensor directory of `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref().to_path_buf();
        ember_train::io::require_regular_file(&path).map_err(|e| GgufError::Io {
            path: path.clone(),
            source: e,
        })?;
        let file = File::open(&path).map_err(|e| GgufError::Io {
            path: path.clone(),
            source: e,
        })?;
        let file_len = file
            .metadata()
            .map_err(|e| GgufError::Io {
                path: path.clone(),
                source: e,
            })?
            .len();
        let mut reader = BufReader::new(file);
        let mut c = Cursor {
            r: &mut reader,
            path: &path,
            remaining: file_len,
        };
        let magic = c.bytes::<4>()?;
        if &magic != b"GGUF" {
            return Err(c.bad("missing the GGUF magic bytes"));
        }
        let version = c.u32()?;
        if !(2..=3).contains(&version) {
            return Err(c.bad(format!("unsupported GGUF version {version}")));
        }
        let n_tensors = c.u64()?;
        let n_kv = c.u64()?;
        // A metadata entry takes at least 12 bytes (key length, type, a byte), a tensor entry
        // at least 24 (name length, dimension count, type, offset).
        let n_kv = c.count("metadata entries", n_kv, 12)?;
        let n_tensors = c.count("tensors", n_tensors, 24)?;
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string()?;
            let t = c.u32()?;
            let v = c.value(t, 0)?;
            metadata.insert(key, v);
        }
        let mut tensors = Vec::with_capacity(n_tensors);
        for _ in 0..n_tensors {
            let name = c.string()?;
            let n_dims = c.u32()?;
            if n_dims > 4 {
                return Err(c.bad(format!("tensor `{name}` has {n_dims} dimensions")));
            }
            let dims = (0..n_dims)
                .map(|_| c.u64())
                .collect::<Result<Vec<_>, _>>()?;
            let elements = dims
                .iter()
                .try_fold(1u64, |n, d| n.checked_mul(*d))
                .filter(|n| *n <= 1 << 40);
            if elements.is_none() {
                return Err(c.bad(format!(
                    "tensor `{name}` has dimensions {dims:?}, too many elements"
                )));
            }
            let ggml_type = c.u32()?;
            let offset = c.u64()?;
            tensors.push(TensorInfo {
                name,
                dims,
                ggml_type,
                offset,
            });
        }
        let alignment = metadata
            .get("general.alignment")
            .and_then(Value::as_u64)
            .unwrap_or(32);
        if !(1..=1 << 16).contains(&alignment) {
            return Err(GgufError::Format {
                path,
                reason: format!("general.alignment = {alignment} is not in 1..=65536"),
            });
        }
        let pos = reader.stream_position().map_err(|e| GgufError::Io {
            path: path.clone(),
            source: e,
        })?;
        let data_start = pos.div_ceil(alignment) * alignment;
        for t in &tensors {
            if let Some((block, bytes)) = block_layout(t.ggml_type) {
                let n = t.len();
                if n % block != 0 {
                    return Err(GgufError::Format {
                        path,
                        reason: format!(
                            "tensor `{}` has {n} elements, not a multiple of its block size {block}",
                            t.name
                        ),
                    });
                }
                let end = data_start
                    .checked_add(t.offset)
                    .and_then(|s| s.checked_add((n / block * bytes) as u64));
                if end.is_none_or(|end| end > file_len) {
                    return Err(GgufError::Format {
                        path,
                        reason: format!("tensor `{}` runs past the end of the file", t.name),
                    });
                }
            }
        }
        Ok(Self {
            path,
            version,
            metadata,
            tensors,
            data_start,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Result<&Value, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::Missing {
            kind: "metadata key",
            name: key.into(),
        })
    }

    /// The directory entry of tensor `name`.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::Missing {
                kind: "tensor",
                name: name.into(),
            })
    }

    /// Reads and dequantizes tensor `name` to f32, in row-major order of [`TensorInfo::shape`].
    pub fn read_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), GgufError> {
        let (raw, info) = self.read_raw(name)?;
        Ok((dequantize(info.ggml_type, &raw, info.len()), info.shape()))
    }

    /// The bytes of tensor `name` as stored (its blocks), with its directory entry.
    pub fn read_raw(&self, name: &str) -> Result<(Vec<u8>, TensorInfo), GgufError> {
        let info = self.tensor_info(name)?.clone();
        let (block, bytes) =
            block_layout(info.ggml_type).ok_or_else(|| GgufError::UnsupportedType {
                name: info.name.clone(),
                ggml_type: info.ggml_type,
                type_name: ggml_type_name(info.ggml_type),
            })?;
        let n = info.len();
        let mut raw = vec![0u8; n / block * bytes];
        let io = |e| GgufError::Io {
            path: self.path.clone(),
            source: e,
        };
        let mut f = File::open(&self.path).map_err(io)?;
        f.seek(SeekFrom::Start(self.data_start + info.offset))
            .map_err(io)?;
        f.read_exact(&mut raw).map_err(io)?;
        Ok((raw, info))
    }
}

/// Dequantizes `n` elements of GGML type `t` from `raw`. Panics on an unsupported type or a
/// short buffer (callers check both).
pub fn dequantize(t: u32, raw: &[u8], n: usize) -> Vec<f32> {
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    let mut out = Vec::with_capacity(n);
    match t {
        0 => out.extend(
            raw.chunks_exact(4)
                .take(n)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        1 => out.extend(raw.chunks_exact(2).take(n).map(|b| h(b, 0))),
        30 => out.extend(
            raw.chunks_exact(2)
                .take(n)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        // Q4_0: d (f16), 16 bytes of nibbles; x_j = (lo_j − 8)·d, x_{j+16} = (hi_j − 8)·d.
        2 => {
            for b in raw.chunks_exact(18).take(n / 32) {
                let d = h(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|q| (f32::from(q & 0x0F) - 8.0) * d));
                out.extend(qs.iter().map(|q| (f32::from(q >> 4) - 8.0) * d));
            }
        }
        // Q4_1: d, m (f16), 16 bytes of nibbles; x = q·d + m.
        3 => {
            for b in raw.chunks_exact(20).take(n / 32) {
                let (d, m) = (h(b, 0), h(b, 2));
                let qs = &b[4..20];
                out.extend(qs.iter().map(|q| f32::from(q & 0x0F) * d + m));
                out.extend(qs.iter().map(|q| f32::from(q >> 4) * d + m));
            }
        }
        // Q8_0: d (f16), 32 signed bytes; x = q·d.
        8 => {
            for b in raw.chunks_exact(34).take(n / 32) {
                let d = h(b, 0);
                out.extend(b[2..34].iter().map(|q| f32::from(*q as i8) * d));
            }
        }
        // Q4_K: d, dmin (f16), 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles.
        12 => {
            for b in raw.chunks_exact(144).take(n / 256) {
                let (d, dmin) = (h(b, 0), h(b, 2));
                let scales = &b[4..16];
                let qs = &b[16..144];
                let scale_min = |j: usize| -> (u8, u8) {
                    if j < 4 {
                        (scales[j] & 63, scales[j + 4] & 63)
                    } else {
                        (
                            (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4),
                            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
                        )
                    }
                };
                for chunk in 0..4 {
                    let q = &qs[chunk * 32..chunk * 32 + 32];
                    let (s1, m1) = scale_min(2 * chunk);
                    let (s2, m2) = scale_min(2 * chunk + 1);
                    let (d1, m1) = (d * f32::from(s1), dmin * f32::from(m1));
                    let (d2, m2) = (d * f32::from(s2), dmin * f32::from(m2));
                    out.extend(q.iter().map(|x| d1 * f32::from(x & 0x0F) - m1));
                    out.extend(q.iter().map(|x| d2 * f32::from(x >> 4) - m2));
                }
            }
        }
        // Q6_K: ql[128], qh[64], scales[16] (i8), d (f16).
        14 => {
            for b in raw.chunks_exact(210).take(n / 256) {
                let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = h(b, 208);
                let mut y = [0f32; 256];
                for half in 0..2 {
                    let (ql, qh, sc) = (&ql[half * 64..], &qh[half * 32..], &sc[half * 8..]);
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = i32::from((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) - 32;
                        let q2 = i32::from((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
                        let q3 = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                        let q4 = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                        let s = |k: usize| f32::from(sc[is + k] as i8);
                        let base = half * 128;
                        y[base + l] = d * s(0) * q1 as f32;
                        y[base + l + 32] = d * s(2) * q2 as f32;
                        y[base + l + 64] = d * s(4) * q3 as f32;
                        y[base + l + 96] = d * s(6) * q4 as f32;
                    }
                }
                out.extend_from_slice(&y);
            }
        }
        other => panic!("dequantize: unsupported GGML type {other}"),
    }
    out
}
