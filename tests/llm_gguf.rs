//! GGUF dequantization against blocks worked out by hand, and against the `gguf` reference
//! package on SmolLM2's real tensors (fixture `tests/fixtures/llm/gguf_blocks.json`).

mod common;

use ember_llm::gguf::{GgufFile, dequantize};
use ember_llm::unpermute_rows;
use half::{bf16, f16};

fn f16b(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

#[test]
fn q8_0_block() {
    // d = 0.5, q_i = i − 16 → x_i = (i − 16)/2.
    let mut b = f16b(0.5).to_vec();
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let x = dequantize(8, &b, 32);
    assert_eq!(
        x,
        (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect::<Vec<_>>()
    );
}

#[test]
fn q4_0_and_q4_1_blocks() {
    // Nibbles: low = j, high = 15 − j for byte j.
    let qs: Vec<u8> = (0..16u8).map(|j| j | ((15 - j) << 4)).collect();
    let mut b = f16b(2.0).to_vec();
    b.extend(&qs);
    let want: Vec<f32> = (0..16)
        .map(|j| (j as f32 - 8.0) * 2.0)
        .chain((0..16).map(|j| (7.0 - j as f32) * 2.0))
        .collect();
    assert_eq!(dequantize(2, &b, 32), want);
    // Q4_1: d = 0.25, m = −1: x = q·d + m.
    let mut b = f16b(0.25).to_vec();
    b.extend(f16b(-1.0));
    b.extend(&qs);
    let want: Vec<f32> = (0..16)
        .map(|j| j as f32 * 0.25 - 1.0)
        .chain((0..16).map(|j| (15 - j) as f32 * 0.25 - 1.0))
        .collect();
    assert_eq!(dequantize(3, &b, 32), want);
}

#[test]
fn f16_bf16_f32() {
    let b: Vec<u8> = [1.5f32, -2.25].iter().flat_map(|x| f16b(*x)).collect();
    assert_eq!(dequantize(1, &b, 2), vec![1.5, -2.25]);
    let b: Vec<u8> = [1.5f32, -2.25]
        .iter()
        .flat_map(|x| bf16::from_f32(*x).to_le_bytes())
        .collect();
    assert_eq!(dequantize(30, &b, 2), vec![1.5, -2.25]);
    let b: Vec<u8> = [0.1f32, 7.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(dequantize(0, &b, 2), vec![0.1, 7.0]);
}

#[test]
fn q4_k_block() {
    // d = 1, dmin = 0.5; 6-bit scales all 1 and mins all 2 (scales[0..4] = 1,
    // scales[4..8] = 2, scales[8..12] = 0x21) → every value is q − 1.
    let mut b = f16b(1.0).to_vec();
    b.extend(f16b(0.5));
    b.extend([1, 1, 1, 1, 2, 2, 2, 2, 0x21, 0x21, 0x21, 0x21]);
    b.extend((0..128u8).map(|k| (k % 16) | ((15 - k % 16) << 4)));
    let x = dequantize(12, &b, 256);
    for chunk in 0..4 {
        for l in 0..32 {
            assert_eq!(x[chunk * 64 + l], (l % 16) as f32 - 1.0);
            assert_eq!(x[chunk * 64 + 32 + l], (15 - l % 16) as f32 - 1.0);
        }
    }
}

#[test]
fn q6_k_block() {
    // ql = 0x21 everywhere (low nibble 1, high 2), qh = 0, scales s_i = i + 1, d = 1:
    // element e: half h = e/128, quarter q = (e%128)/32, l = e%32;
    // x = (8h + l/16 + 2q + 1) · ((q < 2 ? 1 : 2) − 32).
    let mut b = vec![0x21u8; 128];
    b.extend(vec![0u8; 64]);
    b.extend((0..16).map(|i| (i + 1) as u8));
    b.extend(f16b(1.0));
    let x = dequantize(14, &b, 256);
    for (e, v) in x.iter().enumerate() {
        let (h, q, l) = (e / 128, (e % 128) / 32, e % 32);
        let scale = (8 * h + l / 16 + 2 * q + 1) as f32;
        let quant = if q < 2 { 1.0 } else { 2.0 };
        assert_eq!(*v, scale * (quant - 32.0), "element {e}");
    }
}

#[test]
fn unpermute_inverts_llama_cpp_permutation() {
    // llama.cpp: w.reshape(heads, 2, d/2, cols).swapaxes(1, 2) — HF row h·d + s·d/2 + j goes to
    // GGUF row h·d + 2j + s. Rows of 2 heads × d = 4, one column holding the HF row index.
    let hf: Vec<f32> = (0..8).map(|r| r as f32).collect();
    let mut gguf = vec![0f32; 8];
    for h in 0..2 {
        for s in 0..2 {
            for j in 0..2 {
                gguf[h * 4 + 2 * j + s] = hf[h * 4 + s * 2 + j];
            }
        }
    }
    assert_eq!(gguf, vec![0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
    assert_eq!(unpermute_rows(&gguf, 8, 1, 2), hf);
}

#[test]
fn truncated_or_foreign_files_are_clear_errors() {
    let dir = std::env::temp_dir().join(format!("ember-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.gguf");
    std::fs::write(&p, b"NOPE1234").unwrap();
    assert!(
        GgufFile::open(&p)
            .unwrap_err()
            .to_string()
            .contains("magic")
    );
    let mut head = b"GGUF".to_vec();
    head.extend(3u32.to_le_bytes());
    head.extend(1u64.to_le_bytes());
    std::fs::write(&p, &head).unwrap();
    assert!(
        GgufFile::open(&p)
            .unwrap_err()
            .to_string()
            .contains("truncated")
    );
    assert!(
        GgufFile::open(dir.join("missing.gguf"))
            .unwrap_err()
            .to_string()
            .contains("missing.gguf")
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A GGUF file: header, `n_kv` metadata entries and `n_t` tensor entries as raw bytes.
fn gguf(n_kv: u64, kv: &[u8], n_t: u64, tensors: &[u8]) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_t.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b.extend(kv);
    b.extend(tensors);
    b
}

/// A GGUF string: u64 length and bytes.
fn gstr(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend(s.as_bytes());
    b
}

/// Sizes and offsets declared by a file are checked against the file before anything is
/// allocated: a 50-byte file declaring a 2^28-element array (8 GiB of values), a 2^40-byte
/// string, overflowing dimensions, a wrapped offset or an absurd alignment is an error naming
/// the problem, never an abort or a panic.
#[test]
fn hostile_sizes_are_errors_not_aborts() {
    let dir = std::env::temp_dir().join(format!("ember-gguf-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("h.gguf");
    let open = |bytes: Vec<u8>| {
        std::fs::write(&p, bytes).unwrap();
        GgufFile::open(&p).unwrap_err().to_string()
    };
    let mut array = gstr("k");
    array.extend(9u32.to_le_bytes());
    array.extend(4u32.to_le_bytes());
    array.extend((1u64 << 28).to_le_bytes());
    let e = open(gguf(1, &array, 0, &[]));
    assert!(e.contains("an array of 268435456"), "{e}");
    let mut string = gstr("k");
    string.extend(8u32.to_le_bytes());
    string.extend((1u64 << 40).to_le_bytes());
    assert!(open(gguf(1, &string, 0, &[])).contains("a string of"));
    assert!(open(gguf(u64::MAX, &[], 0, &[])).contains("metadata entries"));
    let tensor = |dims: &[u64], offset: u64| {
        let mut t = gstr("t");
        t.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            t.extend(d.to_le_bytes());
        }
        t.extend(0u32.to_le_bytes());
        t.extend(offset.to_le_bytes());
        t
    };
    let e = open(gguf(0, &[], 1, &tensor(&[u64::MAX, 2], 0)));
    assert!(e.contains("too many elements"), "{e}");
    let e = open(gguf(0, &[], 1, &tensor(&[4], u64::MAX - 2)));
    assert!(e.contains("runs past the end"), "{e}");
    let mut align = gstr("general.alignment");
    align.extend(10u32.to_le_bytes());
    align.extend((1u64 << 40).to_le_bytes());
    assert!(open(gguf(1, &align, 0, &[])).contains("general.alignment"));
    // A token-type list longer than the token list.
    let mut kv = gstr("tokenizer.ggml.model");
    kv.extend(8u32.to_le_bytes());
    kv.extend(gstr("gpt2"));
    kv.extend(gstr("tokenizer.ggml.tokens"));
    kv.extend(9u32.to_le_bytes());
    kv.extend(8u32.to_le_bytes());
    kv.extend(1u64.to_le_bytes());
    kv.extend(gstr("a"));
    kv.extend(gstr("tokenizer.ggml.merges"));
    kv.extend(9u32.to_le_bytes());
    kv.extend(8u32.to_le_bytes());
    kv.extend(0u64.to_le_bytes());
    kv.extend(gstr("tokenizer.ggml.token_type"));
    kv.extend(9u32.to_le_bytes());
    kv.extend(4u32.to_le_bytes());
    kv.extend(3u64.to_le_bytes());
    for _ in 0..3 {
        kv.extend(3u32.to_le_bytes());
    }
    std::fs::write(&p, gguf(4, &kv, 0, &[])).unwrap();
    let file = GgufFile::open(&p).unwrap();
    let e = ember_llm::Tokenizer::from_gguf(&file)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("3 entries for 1 tokens"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[derive(serde::Deserialize)]
struct Rows {
    #[serde(rename = "type")]
    ty: String,
    shape: Vec<usize>,
    rows: std::collections::BTreeMap<String, Vec<f32>>,
}

#[test]
fn smollm2_tensors_match_the_gguf_reference_dequantizer() {
    let Some(path) = common::assets::smollm2() else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let fx: std::collections::BTreeMap<String, Rows> = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/llm/gguf_blocks.json"
        ))
        .unwrap(),
    )
    .unwrap();
    assert_eq!(fx.len(), 3);
    for (name, want) in fx {
        let (data, shape) = file.read_f32(&name).unwrap();
        assert_eq!(shape, want.shape, "{name} ({})", want.ty);
        let cols = shape[1];
        for (row, values) in &want.rows {
            let r: usize = row.parse().unwrap();
            assert_eq!(
                &data[r * cols..r * cols + values.len()],
                values.as_slice(),
                "{name} row {r}"
            );
        }
    }
}
