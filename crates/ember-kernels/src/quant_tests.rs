//! The blocked product against its decomposed reference, and the blocks against ggml's.

use super::*;
use burn::tensor::{Distribution, TensorData, Tolerance};

fn device() -> Device {
    let d = Device::default();
    assert!(
        fused_on(&d),
        "the tests need the CPU backend (the `flex` feature)"
    );
    d
}

/// f16 bit patterns: 0.5, −1.0, 0.25.
const HALF: [u8; 2] = [0x00, 0x38];
const MINUS_ONE: [u8; 2] = [0x00, 0xBC];
const QUARTER: [u8; 2] = [0x00, 0x34];

#[test]
fn blocks_decode_to_hand_worked_weights() {
    // Q4_1: d = 0.5, m = −1, byte j = j | (15 − j) << 4 → w_j = 0.5 j − 1, w_{j+16} = 6.5 − 0.5 j.
    let mut raw = [HALF, MINUS_ONE].concat();
    raw.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let q = QuantMatrix::from_ggml(QuantKind::Q4_1, 1, 32, &raw).unwrap();
    let want: Vec<f32> = (0..16)
        .map(|j| 0.5 * j as f32 - 1.0)
        .chain((0..16).map(|j| 6.5 - 0.5 * j as f32))
        .collect();
    assert_eq!(q.dequantize(), want);
    assert_eq!(q.to_ggml(), raw);
    // Q8_0: d = 0.25, codes −16..16 → w_j = 0.25 (j − 16).
    let mut raw = QUARTER.to_vec();
    raw.extend((0..32i8).map(|j| (j - 16) as u8));
    let q = QuantMatrix::from_ggml(QuantKind::Q8_0, 1, 32, &raw).unwrap();
    let want: Vec<f32> = (0..32).map(|j| 0.25 * (j as f32 - 16.0)).collect();
    assert_eq!(q.dequantize(), want);
    assert_eq!(q.bytes(), 4 + 32);
    // BF16: bit patterns 1.0, −2.0, 0.5 and 2⁻¹³³ (a subnormal) across two rows of 32; held as
    // one packed panel of 32 × 32 pairs (two rows, 32 inputs → one step, one panel).
    let pattern = [[0x80, 0x3F], [0x00, 0xC0], [0x00, 0x3F], [0x01, 0x00]];
    let at = |i: usize| (i + i / 32) % 4;
    let raw: Vec<u8> = (0..64).flat_map(|i| pattern[at(i)]).collect();
    let q = QuantMatrix::from_ggml(QuantKind::Bf16, 2, 32, &raw).unwrap();
    let tiny = f32::from_bits(1 << 16);
    let want: Vec<f32> = (0..64).map(|i| [1.0, -2.0, 0.5, tiny][at(i)]).collect();
    assert_eq!(q.dequantize(), want);
    assert_eq!(q.to_ggml(), raw);
    assert_eq!(q.bytes(), 32 * 32 * 2);
    let swapped = q.select_rows(&[1, 0]).unwrap().dequantize();
    assert_eq!(swapped, [&want[32..], &want[..32]].concat());
}

#[test]
fn quantize_writes_the_bytes_ggml_writes() {
    // Fixture: scripts/make_quant_fixtures.py (the `gguf` package's bit-exact quantizers).
    let text = include_str!("../fixtures/quant_blocks.json");
    let v: serde_json::Value = serde_json::from_str(text).unwrap();
    let (rows, cols) = (3, 96);
    let w: Vec<f32> = v["weights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    for kind in [QuantKind::Q4_1, QuantKind::Q8_0, QuantKind::Bf16] {
        let want = v[kind.name()].as_str().unwrap();
        let got: String = QuantMatrix::quantize(kind, rows, cols, &w)
            .unwrap()
            .to_ggml()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want, "{}", kind.name());
    }
}

#[test]
fn quantized_weights_lie_within_half_a_step() {
    let w: Vec<f32> = (0..4 * 64)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
        .collect();
    for kind in [QuantKind::Q4_1, QuantKind::Q8_0] {
        let q = QuantMatrix::quantize(kind, 4, 64, &w).unwrap();
        for (b, (a, x)) in q.dequantize().chunks(32).zip(w.chunks(32)).enumerate() {
            let (lo, hi) = x
                .iter()
                .fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
            let step = match kind {
                QuantKind::Q4_1 => (hi - lo) / 15.0,
                QuantKind::Q8_0 => lo.abs().max(hi.abs()) / 127.0,
                QuantKind::Bf16 => unreachable!("not in this test's kinds"),
            };
            for (a, x) in a.iter().zip(x) {
                // Half a step, plus the f16 rounding of the scales (2⁻¹¹ relative).
                let bound = step * 0.5 + (lo.abs() + hi.abs()) * 2e-3;
                assert!(
                    (a - x).abs() <= bound,
                    "{} block {b}: {a} for {x}",
                    kind.name()
                );
            }
        }
    }
}

#[test]
fn bad_shapes_and_weights_are_named() {
    let e = QuantMatrix::from_ggml(QuantKind::Q4_1, 2, 48, &[0; 60]).unwrap_err();
    assert!(e.to_string().contains("multiple of 32"), "{e}");
    let e = QuantMatrix::from_ggml(QuantKind::Q8_0, 2, 32, &[0; 67]).unwrap_err();
    assert!(e.to_string().contains("67 bytes where 68"), "{e}");
    let e = QuantMatrix::from_ggml(QuantKind::Q8_0, usize::MAX, 64, &[]).unwrap_err();
    assert!(e.to_string().contains("overflows"), "{e}");
    let mut w = vec![0.1f32; 64];
    w[40] = f32::NAN;
    let e = QuantMatrix::quantize(QuantKind::Q4_1, 1, 64, &w).unwrap_err();
    assert!(e.to_string().contains("weight 40 is NaN"), "{e}");
    let q = QuantMatrix::quantize(QuantKind::Q8_0, 2, 32, &[0.5; 64]).unwrap();
    assert!(q.select_rows(&[0, 2]).is_err());
    assert!(q.select_rows(&[1]).is_err());
}

#[test]
fn select_rows_reorders_whole_rows() {
    let w: Vec<f32> = (0..3 * 32)
        .map(|i| (i / 32) as f32 + (i % 32) as f32 * 0.01)
        .collect();
    let q = QuantMatrix::quantize(QuantKind::Q8_0, 3, 32, &w).unwrap();
    let d = q.dequantize();
    let p = q.select_rows(&[2, 0, 1]).unwrap().dequantize();
    assert_eq!(p[..32], d[64..]);
    assert_eq!(p[32..64], d[..32]);
    assert_eq!(p[64..], d[32..64]);
}

/// The blocked product against the reference, in values and in x's gradient, for batches on
/// both sides of the four-row groups and row counts on both sides of the parallel split.
fn check(kind: QuantKind, n: usize, rows: usize, cols: usize, seed: u64) {
    let dev = device();
    dev.seed(seed);
    let w = Tensor::<2>::random([rows, cols], Distribution::Normal(0.0, 0.1), &dev);
    let q = QuantMatrix::quantize(
        kind,
        rows,
        cols,
        &w.into_data().try_to_vec::<f32>().unwrap(),
    )
    .unwrap();
    let x0 = Tensor::<2>::random([n, cols], Distribution::Normal(0.0, 1.0), &dev);
    let ad = dev.clone().autodiff();
    let dy = Tensor::<2>::random([n, rows], Distribution::Normal(0.0, 1.0), &ad);
    let run = |fused: bool| {
        let x = Tensor::<2>::from_data(x0.to_data(), &ad).require_grad();
        let y = match fused {
            true => quant_linear(x.clone(), &q),
            false => quant_linear_reference(x.clone(), &q),
        };
        let g = (y.clone() * dy.clone()).sum().backward();
        (y.inner(), x.grad(&g).unwrap())
    };
    let ((y, gx), (yr, gxr)) = (run(true), run(false));
    let tol = Tolerance::absolute(2e-4 * (cols as f64).sqrt());
    y.into_data().assert_approx_eq::<f32>(&yr.into_data(), tol);
    gx.into_data()
        .assert_approx_eq::<f32>(&gxr.into_data(), tol);
    // Without autodiff: the same values.
    let plain = quant_linear(x0.clone(), &q);
    let reference = quant_linear_reference(x0, &q);
    plain
        .into_data()
        .assert_approx_eq::<f32>(&reference.into_data(), tol);
}

#[test]
fn blocked_product_matches_the_reference() {
    for kind in [QuantKind::Q4_1, QuantKind::Q8_0] {
        for (n, rows, cols) in [
            (1, 7, 32),
            (2, 45, 96),
            (3, 33, 576),
            (4, 64, 64),
            (5, 300, 576),
            (9, 1000, 128),
        ] {
            check(kind, n, rows, cols, (n * rows) as u64);
        }
    }
}

/// BF16 weights: the product is the tiles' (`amx_matmul` of the same rounded weights, bit for
/// bit) where the CPU has them, else the f32 product of the bf16 weights; x's gradient is the
/// f32 `dy · W` either way.
#[test]
fn bf16_weights_multiply_as_the_tiles_do() {
    let dev = device();
    for (n, rows, cols) in [(1, 45, 96), (3, 576, 576), (37, 70, 64), (130, 33, 128)] {
        dev.seed(n as u64);
        let w = Tensor::<2>::random([rows, cols], Distribution::Normal(0.0, 0.1), &dev);
        let wv = w.into_data().try_to_vec::<f32>().unwrap();
        let q = QuantMatrix::quantize(QuantKind::Bf16, rows, cols, &wv).unwrap();
        let deq = Tensor::<2>::from_data(TensorData::new(q.dequantize(), [rows, cols]), &dev);
        let x = Tensor::<2>::random([n, cols], Distribution::Normal(0.0, 1.0), &dev);
        let got = quant_linear(x.clone(), &q).into_data();
        let want = match amx_available() {
            true => amx_matmul(x.clone(), deq.clone().transpose()),
            false => x.clone().matmul(deq.clone().transpose()),
        };
        assert_eq!(got, want.into_data(), "{n} × {cols} · {cols} × {rows}");
        let ad = dev.clone().autodiff();
        let xa = Tensor::<2>::from_data(x.to_data(), &ad).require_grad();
        let dy = Tensor::<2>::random([n, rows], Distribution::Normal(0.0, 1.0), &ad);
        let g = (quant_linear(xa.clone(), &q) * dy.clone()).sum().backward();
        let want = dy.inner().matmul(deq);
        xa.grad(&g)
            .unwrap()
            .into_data()
            .assert_approx_eq::<f32>(&want.into_data(), Tolerance::absolute(1e-5));
    }
}

#[test]
fn blocked_product_of_no_rows_is_empty() {
    let q = QuantMatrix::quantize(QuantKind::Q4_1, 3, 32, &[0.2; 96]).unwrap();
    let x = Tensor::<2>::zeros([0, 32], &device());
    assert_eq!(quant_linear(x, &q).dims(), [0, 3]);
}

/// Every instruction set this CPU has (AVX-512, AVX2, the portable loops) against the
/// dequantized weights' dot products, on odd batches and a row count split over tasks.
#[test]
fn every_instruction_set_computes_the_same_products() {
    use crate::cpu_quant::{Isa, products};
    let (rows, cols) = (2100, 544);
    let w: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-3)
        .collect();
    for kind in [QuantKind::Q4_1, QuantKind::Q8_0] {
        let q = QuantMatrix::quantize(kind, rows, cols, &w).unwrap();
        let deq = q.dequantize();
        for n in [1, 3, 6] {
            let xs: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 31 % 97) as f32 - 48.0) * 0.02)
                .collect();
            let want: Vec<f32> = (0..n * rows)
                .map(|i| {
                    let (r, o) = (i / rows, i % rows);
                    let x = &xs[r * cols..(r + 1) * cols];
                    x.iter()
                        .zip(&deq[o * cols..(o + 1) * cols])
                        .map(|(a, b)| a * b)
                        .sum()
                })
                .collect();
            for isa in [Isa::Widest, Isa::Avx2, Isa::Portable] {
                let got = products(&xs, &q, isa);
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-3, "{kind:?} n {n} {isa:?}: {worst}");
            }
        }
    }
}
