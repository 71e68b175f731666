//! The Tinker SDK's wire shapes (SDK 0.38.0): the protobuf messages of `forward_backward`'s
//! request and of the two results the SDK reads as protobuf (`ForwardBackwardOutput`,
//! `SampleResponse`), declared with `prost` from the SDK's `tinker_public.proto` (package
//! `tinker_public`), and the tensor codecs around them. Every numeric `bytes` field is a
//! little-endian packed array.

use prost::Message;
use std::collections::HashMap;

/// `tinker_public.DType`.
pub const DTYPE_FLOAT32: i32 = 1;
/// `tinker_public.DType` int64.
pub const DTYPE_INT64: i32 = 2;
/// `tinker_public.DType` int32.
pub const DTYPE_INT32: i32 = 3;
/// `tinker_public.DType` bfloat16.
pub const DTYPE_BFLOAT16: i32 = 4;

/// `tinker_public.ForwardBackwardRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct ForwardBackwardRequest {
    #[prost(string, tag = "1")]
    pub model_id: String,
    #[prost(int32, tag = "2")]
    pub seq_id: i32,
    #[prost(message, repeated, tag = "3")]
    pub data: Vec<Datum>,
    #[prost(string, tag = "4")]
    pub loss_fn: String,
    #[prost(map = "string, double", tag = "5")]
    pub loss_fn_config: HashMap<String, f64>,
    #[prost(bool, tag = "6")]
    pub forward_only: bool,
    #[prost(map = "string, message", tag = "7")]
    pub loss_fn_config_v2: HashMap<String, LossConfigValue>,
}

/// `tinker_public.LossConfigValue`.
#[derive(Clone, PartialEq, Message)]
pub struct LossConfigValue {
    #[prost(oneof = "ConfigValue", tags = "1, 2")]
    pub value: Option<ConfigValue>,
}

/// The value of a [`LossConfigValue`].
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ConfigValue {
    #[prost(double, tag = "1")]
    Number(f64),
    #[prost(string, tag = "2")]
    Text(String),
}

/// `tinker_public.Datum` (provenance spans, fields 3 and 4, are skipped: they serve only
/// `stable_reinforce`, which is refused).
#[derive(Clone, PartialEq, Message)]
pub struct Datum {
    #[prost(message, repeated, tag = "1")]
    pub model_input: Vec<Chunk>,
    #[prost(map = "string, message", tag = "2")]
    pub loss_fn_inputs: HashMap<String, WireTensor>,
}

/// `tinker_public.Chunk`: text tokens, an image or a dmel chunk.
#[derive(Clone, PartialEq, Message)]
pub struct Chunk {
    #[prost(oneof = "ChunkKind", tags = "1, 2, 3")]
    pub chunk: Option<ChunkKind>,
}

/// The kinds of [`Chunk`]; images and dmel are read only to be refused by name.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum ChunkKind {
    #[prost(message, tag = "1")]
    EncodedText(EncodedText),
    #[prost(bytes, tag = "2")]
    Image(Vec<u8>),
    #[prost(bytes, tag = "3")]
    Dmel(Vec<u8>),
}

/// `tinker_public.EncodedTextChunk`: int32 token ids.
#[derive(Clone, PartialEq, Message)]
pub struct EncodedText {
    #[prost(bytes = "vec", tag = "1")]
    pub tokens: Vec<u8>,
}

/// `tinker_public.Tensor`: dense bytes or a sparse CSR matrix, a dtype and a shape.
#[derive(Clone, PartialEq, Message)]
pub struct WireTensor {
    #[prost(oneof = "Encoding", tags = "1, 2")]
    pub encoding: Option<Encoding>,
    #[prost(int32, tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub shape: Vec<i64>,
}

/// How a [`WireTensor`] holds its values.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum Encoding {
    #[prost(bytes, tag = "1")]
    Dense(Vec<u8>),
    #[prost(message, tag = "2")]
    SparseCsr(SparseCsr),
}

/// `tinker_public.SparseCsr`: values, int64 row pointers and int64 column indices.
#[derive(Clone, PartialEq, Message)]
pub struct SparseCsr {
    #[prost(bytes = "vec", tag = "1")]
    pub values: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub crow_indices: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    pub col_indices: Vec<u8>,
}

/// `tinker_public.ForwardBackwardOutput`.
#[derive(Clone, PartialEq, Message)]
pub struct ForwardBackwardOutput {
    #[prost(string, tag = "1")]
    pub loss_fn_output_type: String,
    #[prost(message, repeated, tag = "2")]
    pub loss_fn_outputs: Vec<ArrayRecord>,
    #[prost(map = "string, double", tag = "3")]
    pub metrics: HashMap<String, f64>,
}

/// `tinker_public.ArrayRecord`: named batched tensors over `num_datums` datums.
#[derive(Clone, PartialEq, Message)]
pub struct ArrayRecord {
    #[prost(string, tag = "1")]
    pub type_tag: String,
    #[prost(map = "string, message", tag = "2")]
    pub fields: HashMap<String, BatchedTensor>,
    #[prost(int64, tag = "3")]
    pub num_datums: i64,
}

/// `tinker_public.BatchedTensor`: every datum's values concatenated, with int64 byte offsets.
#[derive(Clone, PartialEq, Message)]
pub struct BatchedTensor {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub offsets: Vec<u8>,
    #[prost(int32, tag = "3")]
    pub dtype: i32,
    #[prost(int64, repeated, tag = "4")]
    pub trailing_shape: Vec<i64>,
}

/// `tinker_public.SampleResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct SampleResponse {
    #[prost(message, repeated, tag = "1")]
    pub sequences: Vec<SampledSequence>,
    #[prost(bytes = "vec", optional, tag = "2")]
    pub prompt_logprobs: Option<Vec<u8>>,
    #[prost(int32, tag = "4")]
    pub prompt_cache_hit_tokens: i32,
}

/// `tinker_public.SampledSequence`.
#[derive(Clone, PartialEq, Message)]
pub struct SampledSequence {
    /// 0 stop, 1 length.
    #[prost(int32, tag = "1")]
    pub stop_reason: i32,
    #[prost(bytes = "vec", tag = "2")]
    pub tokens: Vec<u8>,
    #[prost(bytes = "vec", optional, tag = "3")]
    pub logprobs: Option<Vec<u8>>,
}

/// Little-endian int32 bytes as token ids (negative ids are an error).
pub fn tokens_from_i32(bytes: &[u8]) -> Result<Vec<u32>, String> {
    if !bytes.len().is_multiple_of(4) {
        return Err(format!(
            "token bytes: {} is not a multiple of 4",
            bytes.len()
        ));
    }
    bytes
        .chunks_exact(4)
        .map(|c| {
            let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            u32::try_from(v).map_err(|_| format!("token id {v} is negative"))
        })
        .collect()
}

/// f32 values as little-endian bytes.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Token ids as little-endian int32 bytes.
pub fn i32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| i32::try_from(x).unwrap_or(i32::MAX).to_le_bytes())
        .collect()
}

/// A tensor's values as f64, whatever its dtype (float32, bfloat16, int32, int64); sparse CSR
/// tensors are expanded. Its element count must be at most `most` (checked before anything is
/// decoded or allocated). `name` names the tensor in errors.
pub fn tensor_values(
    name: &str,
    t: &WireTensor,
    most: usize,
) -> Result<(Vec<f64>, Vec<usize>), String> {
    let shape: Vec<usize> = t
        .shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("{name}: negative dimension {d}")))
        .collect::<Result<_, _>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .filter(|&c| c <= most)
        .ok_or_else(|| format!("{name}: shape {shape:?} holds more than {most} values"))?;
    let values = match &t.encoding {
        Some(Encoding::Dense(b)) => decode(name, b, t.dtype)?,
        Some(Encoding::SparseCsr(s)) => sparse(name, s, t.dtype, &shape)?,
        None => Vec::new(),
    };
    if values.len() != count {
        return Err(format!(
            "{name}: {} values for shape {shape:?}",
            values.len()
        ));
    }
    Ok((values, shape))
}

fn decode(name: &str, b: &[u8], dtype: i32) -> Result<Vec<f64>, String> {
    let width = match dtype {
        DTYPE_FLOAT32 | DTYPE_INT32 => 4,
        DTYPE_INT64 => 8,
        DTYPE_BFLOAT16 => 2,
        d => return Err(format!("{name}: unknown dtype {d}")),
    };
    if !b.len().is_multiple_of(width) {
        return Err(format!(
            "{name}: {} bytes is not a multiple of {width}",
            b.len()
        ));
    }
    Ok(b.chunks_exact(width)
        .map(|c| match dtype {
            DTYPE_FLOAT32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DTYPE_INT32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DTYPE_BFLOAT16 => f64::from(f32::from_bits(
                u32::from(u16::from_le_bytes([c[0], c[1]])) << 16,
            )),
            _ => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
        })
        .collect())
}

fn sparse(name: &str, s: &SparseCsr, dtype: i32, shape: &[usize]) -> Result<Vec<f64>, String> {
    let [rows, cols] = shape else {
        return Err(format!(
            "{name}: a sparse tensor must be 2-D, got {shape:?}"
        ));
    };
    let values = decode(name, &s.values, dtype)?;
    let index = |b: &[u8]| -> Result<Vec<usize>, String> {
        decode(name, b, DTYPE_INT64)?
            .into_iter()
            .map(|v| {
                (v >= 0.0 && v.fract() == 0.0)
                    .then_some(v as usize)
                    .ok_or_else(|| format!("{name}: bad sparse index {v}"))
            })
            .collect()
    };
    let (crow, col) = (index(&s.crow_indices)?, index(&s.col_indices)?);
    if crow.len() != rows + 1 || col.len() != values.len() {
        return Err(format!("{name}: inconsistent sparse CSR arrays"));
    }
    let mut out = vec![0.0; rows * cols];
    for r in 0..*rows {
        let (a, b) = (crow[r], crow[r + 1]);
        if a > b || b > values.len() {
            return Err(format!("{name}: bad sparse row pointers"));
        }
        for k in a..b {
            if col[k] >= *cols {
                return Err(format!("{name}: sparse column {} out of range", col[k]));
            }
            out[r * cols + col[k]] = values[k];
        }
    }
    Ok(out)
}

/// One `ArrayRecord` of per-datum f32 vectors under `field` (offsets in bytes).
pub fn record_of(field: &str, per_datum: &[Vec<f32>]) -> ArrayRecord {
    let mut data = Vec::new();
    let mut offsets = vec![0i64];
    for v in per_datum {
        data.extend(f32_bytes(v));
        offsets.push(data.len() as i64);
    }
    let offsets = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    let tensor = BatchedTensor {
        data,
        offsets,
        dtype: DTYPE_FLOAT32,
        trailing_shape: Vec::new(),
    };
    ArrayRecord {
        type_tag: "ArrayRecord".into(),
        fields: HashMap::from([(field.to_string(), tensor)]),
        num_datums: per_datum.len() as i64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_and_sparse_tensors_decode_to_the_same_values() {
        let dense = WireTensor {
            encoding: Some(Encoding::Dense(f32_bytes(&[0.0, 2.0, 0.0, 0.0, 0.0, -1.5]))),
            dtype: DTYPE_FLOAT32,
            shape: vec![2, 3],
        };
        let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let csr = WireTensor {
            encoding: Some(Encoding::SparseCsr(SparseCsr {
                values: f32_bytes(&[2.0, -1.5]),
                crow_indices: i64s(&[0, 1, 2]),
                col_indices: i64s(&[1, 2]),
            })),
            dtype: DTYPE_FLOAT32,
            shape: vec![2, 3],
        };
        let (a, shape) = tensor_values("w", &dense, 6).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(a, tensor_values("w", &csr, 6).unwrap().0);
        assert_eq!(a, vec![0.0, 2.0, 0.0, 0.0, 0.0, -1.5]);
        let bad = WireTensor {
            shape: vec![4],
            ..dense
        };
        assert!(
            tensor_values("w", &bad, 6)
                .unwrap_err()
                .contains("6 values for shape [4]")
        );
    }

    #[test]
    fn a_request_round_trips_and_tokens_decode() {
        let req = ForwardBackwardRequest {
            model_id: "s:train:0".into(),
            seq_id: 3,
            data: vec![Datum {
                model_input: vec![Chunk {
                    chunk: Some(ChunkKind::EncodedText(EncodedText {
                        tokens: i32_bytes(&[5, 6, 7]),
                    })),
                }],
                loss_fn_inputs: HashMap::new(),
            }],
            loss_fn: "cross_entropy".into(),
            ..Default::default()
        };
        let back = ForwardBackwardRequest::decode(&req.encode_to_vec()[..]).unwrap();
        assert_eq!(back, req);
        assert_eq!(
            tokens_from_i32(&i32_bytes(&[5, 6, 7])).unwrap(),
            vec![5, 6, 7]
        );
        assert!(tokens_from_i32(&(-1i32).to_le_bytes()).is_err());
        let r = record_of("logprobs", &[vec![-1.0, -2.0], vec![-0.5]]);
        assert_eq!(r.num_datums, 2);
        let off = &r.fields["logprobs"].offsets;
        assert_eq!(off.len(), 24);
        assert_eq!(i64::from_le_bytes(off[16..24].try_into().unwrap()), 12);
    }
}
