use super::*;

/// A deterministic fill in [−1, 1) (a linear congruential generator's high bits).
fn fill(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// `x` rounded to bf16 and widened back.
fn rounded(x: f32) -> f64 {
    f32::from_bits((bf16_bits(x) as u32) << 16) as f64
}

/// The reference: `A·B` of the rounded inputs, summed in f64.
fn reference(a: &Matrix<'_>, b: &Matrix<'_>) -> Vec<f64> {
    let at = |v: &Matrix<'_>, r: usize, c: usize| {
        rounded(v.data[v.offset + r * v.row_stride + c * v.col_stride])
    };
    let mut out = Vec::with_capacity(a.rows * b.cols);
    for i in 0..a.rows {
        for j in 0..b.cols {
            out.push((0..a.cols).map(|p| at(a, i, p) * at(b, p, j)).sum());
        }
    }
    out
}

/// `matmul` against [`reference`]: equal up to f32 rounding of the sums (the inputs are rounded
/// the same way on both sides), or `Unavailable` where the machine has no AMX.
fn check(a: Matrix<'_>, b: Matrix<'_>) {
    let got = matmul(a, b);
    if !available() && a.rows * a.cols * b.cols > 0 {
        assert_eq!(got, Err(AmxError::Unavailable));
        return;
    }
    let (got, want) = (got.unwrap(), reference(&a, &b));
    assert_eq!(got.len(), want.len());
    let tol = 2e-6 * (a.cols as f64).sqrt();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (*g as f64 - w).abs() <= tol * (1.0 + w.abs()),
            "{} × {} · {} × {}, element {i}: {g} against {w}",
            a.rows,
            a.cols,
            b.rows,
            b.cols
        );
    }
}

#[test]
fn products_match_the_rounded_reference_in_every_layout() {
    // Shapes: one element, odd edges below a tile, one row task (the columns split), several
    // row tasks with edge panels, an inner size that is not a multiple of the 32-wide step.
    for (m, k, n) in [
        (1, 1, 1),
        (5, 7, 3),
        (33, 65, 47),
        (64, 64, 64),
        (300, 100, 70),
    ] {
        let (a, b) = (fill(m * k, 1), fill(k * n, 2));
        let ar = Matrix::row_major(&a, m, k);
        let br = Matrix::row_major(&b, k, n);
        let ac = Matrix::row_major(&a, k, m).t();
        let bc = Matrix::row_major(&b, n, k).t();
        for (a, b) in [(ar, br), (ac, br), (ar, bc), (ac, bc)] {
            check(a, b);
        }
    }
}

/// A 9 × 40 block of a 20 × 50 matrix (`big`) from row 3, column 5; every second column of a
/// 40 × 26 matrix (`wide`) from column 1: neither layout is contiguous along a row or a column.
fn strided_views<'a>(big: &'a [f32], wide: &'a [f32]) -> (Matrix<'a>, Matrix<'a>) {
    let a = Matrix {
        data: big,
        offset: 3 * 50 + 5,
        rows: 9,
        cols: 40,
        row_stride: 50,
        col_stride: 1,
    };
    let b = Matrix {
        data: wide,
        offset: 1,
        rows: 40,
        cols: 13,
        row_stride: 26,
        col_stride: 2,
    };
    (a, b)
}

#[test]
fn strided_views_with_offsets_read_their_own_elements() {
    let (big, wide) = (fill(20 * 50, 3), fill(40 * 26, 4));
    let (a, b) = strided_views(&big, &wide);
    check(a, b);
    check(b.t(), a.t());
}

#[test]
fn bf16_rounding_is_to_nearest_even() {
    // 1 + 2⁻⁸ is halfway between 1 and the next bf16 (1 + 2⁻⁷): even, down; 1 + 3·2⁻⁸ is
    // halfway between 1 + 2⁻⁷ and 1 + 2·2⁻⁷: even, up; a hair above halfway rounds up.
    assert_eq!(bf16_bits(1.0), 0x3f80);
    assert_eq!(bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert_eq!(bf16_bits(-0.0), 0x8000);
    assert_eq!(bf16_bits(f32::INFINITY), 0x7f80);
    // The largest f32 is past the largest bf16's halfway point: infinity.
    assert_eq!(bf16_bits(f32::MAX), 0x7f80);
    let nan = bf16_bits(f32::NAN);
    assert!(nan & 0x7f80 == 0x7f80 && nan & 0x7f != 0, "{nan:#x}");
}

#[test]
fn bad_shapes_and_views_are_errors() {
    let a = fill(6, 5);
    let b = fill(6, 6);
    let (a23, b23) = (Matrix::row_major(&a, 2, 3), Matrix::row_major(&b, 2, 3));
    assert_eq!(matmul(a23, b23), Err(AmxError::Shapes(2, 3, 2, 3)));
    let past = Matrix {
        offset: 1,
        ..Matrix::row_major(&b, 3, 2)
    };
    assert_eq!(matmul(a23, past), Err(AmxError::OutOfBounds(6)));
    let huge = Matrix {
        row_stride: usize::MAX,
        ..Matrix::row_major(&b, 3, 2)
    };
    assert_eq!(matmul(a23, huge), Err(AmxError::OutOfBounds(6)));
    // Empty products are zeros of their shape, with or without AMX.
    assert_eq!(
        matmul(Matrix::row_major(&a, 2, 0), Matrix::row_major(&b, 0, 3)),
        Ok(vec![0.0; 6])
    );
    assert_eq!(
        matmul(Matrix::row_major(&a, 0, 3), Matrix::row_major(&b, 3, 2)),
        Ok(vec![])
    );
}

#[test]
fn a_packed_operand_gives_the_product_of_packing_each_time() {
    // B as it lies and transposed (a weight `[out, in]` read as `Wᵀ`), odd edges, one row
    // (a decoding step) and 37 rows.
    for (m, k, n) in [(1, 576, 96), (37, 70, 45), (32, 64, 32)] {
        let (xa, xb) = (fill(m * k, 11), fill(k * n, 12));
        let a = Matrix::row_major(&xa, m, k);
        for b in [
            Matrix::row_major(&xb, k, n),
            Matrix::row_major(&xb, n, k).t(),
        ] {
            let packed = PackedB::new(b).unwrap();
            assert_eq!((packed.rows(), packed.cols()), (k, n));
            for (r, c) in [(0, 0), (k - 1, n - 1), (k / 2, n / 3)] {
                let v = b.data[r * b.row_stride + c * b.col_stride];
                assert_eq!(packed.get(r, c), Some(rounded(v) as f32));
            }
            assert_eq!(packed.get(k, 0), None);
            let whole = packed.unpack();
            assert!((0..k * n).all(|i| Some(whole[i]) == packed.get(i / n, i % n)));
            match available() {
                true => assert_eq!(matmul_packed(a, &packed), matmul(a, b)),
                false => assert_eq!(matmul_packed(a, &packed), Err(AmxError::Unavailable)),
            }
        }
    }
}

#[test]
fn a_packed_operand_checks_its_shapes() {
    let (xa, xb) = (fill(6, 1), fill(12, 2));
    let packed = PackedB::new(Matrix::row_major(&xb, 4, 3)).unwrap();
    assert_eq!(
        matmul_packed(Matrix::row_major(&xa, 2, 3), &packed),
        Err(AmxError::Shapes(2, 3, 4, 3))
    );
    let past = Matrix {
        offset: 1,
        ..Matrix::row_major(&xb, 4, 3)
    };
    assert_eq!(PackedB::new(past), Err(AmxError::OutOfBounds(12)));
    let empty = PackedB::new(Matrix::row_major(&[], 0, 5)).unwrap();
    assert_eq!((empty.rows(), empty.cols(), empty.bytes()), (0, 5, 0));
    let zero = matmul_packed(Matrix::row_major(&[], 2, 0), &empty).unwrap();
    assert_eq!(zero, vec![0.0; 10]);
}

/// `matmul_f32` against an f64 sum of the unrounded inputs, in every layout, odd edges, one
/// element, strided views with offsets, and products below and above the size from which
/// the cores share the work.
#[test]
fn f32_products_match_the_f64_reference_in_every_layout() {
    let exact = |a: &Matrix<'_>, b: &Matrix<'_>| {
        let at = |v: &Matrix<'_>, r: usize, c: usize| {
            v.data[v.offset + r * v.row_stride + c * v.col_stride] as f64
        };
        let mut out = Vec::new();
        for i in 0..a.rows {
            for j in 0..b.cols {
                out.push((0..a.cols).map(|p| at(a, i, p) * at(b, p, j)).sum::<f64>());
            }
        }
        out
    };
    for (m, k, n) in [(1, 1, 1), (7, 33, 5), (200, 240, 190)] {
        let (xa, xb) = (fill(m * k, 1), fill(k * n, 2));
        let layouts = [
            (Matrix::row_major(&xa, m, k), Matrix::row_major(&xb, k, n)),
            (
                Matrix::row_major(&xa, k, m).t(),
                Matrix::row_major(&xb, n, k).t(),
            ),
        ];
        for (a, b) in layouts {
            let got = matmul_f32(a, b).unwrap();
            let want = exact(&a, &b);
            for (g, w) in got.iter().zip(&want) {
                assert!((*g as f64 - w).abs() <= 1e-5 * (k as f64).sqrt() * (1.0 + w.abs()));
            }
        }
    }
    // The strided views of `strided_views`, with offsets.
    let (big, wide) = (fill(20 * 50, 3), fill(40 * 26, 4));
    let (a, b) = strided_views(&big, &wide);
    let (got, want) = (matmul_f32(a, b).unwrap(), exact(&a, &b));
    assert!(
        got.iter()
            .zip(&want)
            .all(|(g, w)| (*g as f64 - w).abs() < 1e-4)
    );
}

#[test]
fn f32_products_check_their_shapes_and_views() {
    let (xa, xb) = (fill(6, 1), fill(12, 2));
    let a = Matrix::row_major(&xa, 2, 3);
    assert_eq!(
        matmul_f32(a, Matrix::row_major(&xb, 4, 3)),
        Err(AmxError::Shapes(2, 3, 4, 3))
    );
    let past = Matrix { offset: 1, ..a };
    assert_eq!(
        matmul_f32(past, Matrix::row_major(&xb, 3, 4)),
        Err(AmxError::OutOfBounds(6))
    );
    assert_eq!(
        matmul_f32(Matrix::row_major(&xa, 2, 0), Matrix::row_major(&xb, 0, 4)),
        Ok(vec![0.0; 8])
    );
}
