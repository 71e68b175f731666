//! `curves.png`: reward and held-out accuracy against the RL step, drawn into an RGB buffer
//! (with a built-in 3×5 pixel font, so no font files are needed) and encoded with `png`.

use anyhow::{Result, anyhow};
use std::path::Path;

const W: usize = 900;
const H: usize = 360;
const SCALE: usize = 2;

struct Canvas {
    px: Vec<u8>,
}

/// 3×5 glyphs, rows top to bottom, 3 bits each (most significant = left column).
fn glyph(c: char) -> [u8; 5] {
    match c.to_ascii_uppercase() {
        '0' => [7, 5, 5, 5, 7],
        '1' => [2, 6, 2, 2, 7],
        '2' => [7, 1, 7, 4, 7],
        '3' => [7, 1, 7, 1, 7],
        '4' => [5, 5, 7, 1, 1],
        '5' => [7, 4, 7, 1, 7],
        '6' => [7, 4, 7, 5, 7],
        '7' => [7, 1, 1, 1, 1],
        '8' => [7, 5, 7, 5, 7],
        '9' => [7, 5, 7, 1, 7],
        '.' => [0, 0, 0, 0, 2],
        '-' => [0, 0, 7, 0, 0],
        '/' => [1, 1, 2, 4, 4],
        'A' => [2, 5, 7, 5, 5],
        'C' => [3, 4, 4, 4, 3],
        'D' => [6, 5, 5, 5, 6],
        'E' => [7, 4, 6, 4, 7],
        'G' => [3, 4, 5, 5, 3],
        'H' => [5, 5, 7, 5, 5],
        'I' => [7, 2, 2, 2, 7],
        'L' => [4, 4, 4, 4, 7],
        'M' => [5, 7, 7, 5, 5],
        'N' => [6, 5, 5, 5, 5],
        'O' => [2, 5, 5, 5, 2],
        'P' => [6, 5, 6, 4, 4],
        'R' => [6, 5, 6, 5, 5],
        'S' => [3, 4, 2, 1, 6],
        'T' => [7, 2, 2, 2, 2],
        'U' => [5, 5, 5, 5, 7],
        'V' => [5, 5, 5, 5, 2],
        'W' => [5, 5, 5, 7, 5],
        'Y' => [5, 5, 2, 2, 2],
        _ => [0; 5],
    }
}

impl Canvas {
    fn new() -> Self {
        Self {
            px: vec![255; W * H * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: [u8; 3]) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: [u8; 3], thick: bool) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, c);
            if thick {
                self.set(x + 1, y, c);
                self.set(x, y + 1, c);
            }
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    fn text(&mut self, x: i64, y: i64, s: &str, c: [u8; 3]) {
        for (k, ch) in s.chars().enumerate() {
            let g = glyph(ch);
            let ox = x + (k * 4 * SCALE) as i64;
            for (r, bits) in g.iter().enumerate() {
                for col in 0..3 {
                    if bits >> (2 - col) & 1 == 1 {
                        for a in 0..SCALE {
                            for b in 0..SCALE {
                                self.set(
                                    ox + (col * SCALE + a) as i64,
                                    y + (r * SCALE + b) as i64,
                                    c,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn text_width(s: &str) -> i64 {
    (s.chars().count() * 4 * SCALE) as i64
}

fn label(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() && v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A series: points and colour.
type Series<'a> = (&'a [(f64, f64)], [u8; 3]);

/// One panel: `series` of (x, y) points with colours, in the box over the canvas's columns
/// `columns`, the y axis over `y_axis`.
fn panel(
    cv: &mut Canvas,
    columns: std::ops::Range<i64>,
    title: &str,
    x_max: f64,
    y_axis: std::ops::RangeInclusive<f64>,
    series: &[Series],
) {
    let (lo, hi) = y_axis.into_inner();
    let (x0, w) = (columns.start, columns.end - columns.start);
    let (left, right, top, bottom) = (x0 + 60, x0 + w - 15, 40i64, H as i64 - 40);
    let grey = [220, 220, 220];
    let ink = [60, 60, 60];
    cv.text(x0 + (w - text_width(title)) / 2, 12, title, ink);
    let span = (hi - lo).max(1e-9);
    let py = |v: f64| bottom - ((v - lo) / span * (bottom - top) as f64).round() as i64;
    let px = |s: f64| left + (s / x_max.max(1.0) * (right - left) as f64).round() as i64;
    for k in 0..=4 {
        let v = lo + span * f64::from(k) / 4.0;
        let y = py(v);
        cv.line((left, y), (right, y), grey, false);
        let l = label(v);
        cv.text(left - 6 - text_width(&l), y - 5, &l, ink);
    }
    for k in 0..=4 {
        let s = x_max * f64::from(k) / 4.0;
        let x = px(s);
        cv.line((x, bottom), (x, bottom + 4), ink, false);
        let l = if s.fract() == 0.0 {
            format!("{s:.0}")
        } else {
            format!("{s:.1}")
        };
        cv.text(x - text_width(&l) / 2, bottom + 8, &l, ink);
    }
    cv.text(
        (left + right - text_width("STEP")) / 2,
        bottom + 24,
        "STEP",
        ink,
    );
    cv.line((left, top), (left, bottom), ink, false);
    cv.line((left, bottom), (right, bottom), ink, false);
    for (pts, c) in series {
        let mut prev: Option<(i64, i64)> = None;
        for (s, v) in pts.iter().filter(|(_, v)| v.is_finite()) {
            let p = (px(*s), py(v.clamp(lo, hi)));
            if let Some(q) = prev {
                cv.line(q, p, *c, true);
            }
            if pts.len() < 60 {
                for d in -2..=2 {
                    cv.set(p.0 + d, p.1, *c);
                    cv.set(p.0, p.1 + d, *c);
                }
            }
            prev = Some(p);
        }
    }
}

/// Draws reward (per step, and its moving average over 10 steps) and held-out accuracy.
pub fn curves(path: &Path, rewards: &[(f64, f64)], accuracy: &[(f64, f64)]) -> Result<()> {
    let mut cv = Canvas::new();
    let x_max = rewards
        .iter()
        .chain(accuracy)
        .map(|(s, _)| *s)
        .fold(1.0, f64::max);
    let smooth: Vec<(f64, f64)> = (0..rewards.len())
        .map(|i| {
            let w = &rewards[i.saturating_sub(9)..=i];
            let f: Vec<f64> = w.iter().map(|p| p.1).filter(|v| v.is_finite()).collect();
            (rewards[i].0, f.iter().sum::<f64>() / f.len().max(1) as f64)
        })
        .collect();
    let finite = rewards.iter().map(|p| p.1).filter(|v| v.is_finite());
    let lo = finite.clone().fold(0.0, f64::min);
    let hi = finite.fold(1.0, f64::max);
    panel(
        &mut cv,
        0..(W / 2) as i64,
        "REWARD MEAN",
        x_max,
        lo..=hi,
        &[(rewards, [160, 190, 230]), (&smooth, [20, 80, 200])],
    );
    panel(
        &mut cv,
        (W / 2) as i64..W as i64,
        "HELD-OUT ACCURACY",
        x_max,
        0.0..=1.0,
        &[(accuracy, [230, 110, 20])],
    );
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, W as u32, H as u32);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut w = enc
            .write_header()
            .map_err(|e| anyhow!("encoding {}: {e}", path.display()))?;
        w.write_image_data(&cv.px)
            .map_err(|e| anyhow!("encoding {}: {e}", path.display()))?;
    }
    crate::write::write_atomic(path, &bytes)
}

/// Writes a grid of grayscale images (values in [0, 1], `side × side` each, row-major) as an
/// 8-bit PNG, `cols` images per row, each pixel drawn `zoom × zoom`, with a 2-pixel gray gutter.
pub fn image_grid(
    path: &Path,
    images: &[Vec<f32>],
    side: usize,
    cols: usize,
    zoom: usize,
) -> Result<()> {
    if images.is_empty() || cols == 0 || zoom == 0 {
        return Err(anyhow!("image_grid: nothing to draw"));
    }
    let rows = images.len().div_ceil(cols);
    let cell = side * zoom + 2;
    let (w, h) = (cols * cell + 2, rows * cell + 2);
    let mut px = vec![128u8; w * h];
    for (n, img) in images.iter().enumerate() {
        let (r, c) = (n / cols, n % cols);
        for y in 0..side * zoom {
            for x in 0..side * zoom {
                let v = img
                    .get((y / zoom) * side + x / zoom)
                    .copied()
                    .unwrap_or(0.0);
                let i = (2 + r * cell + y) * w + 2 + c * cell + x;
                px[i] = (v.clamp(0.0, 1.0) * 255.0).round() as u8;
            }
        }
    }
    let mut bytes = Vec::new();
    {
        let mut enc = png::Encoder::new(&mut bytes, w as u32, h as u32);
        enc.set_color(png::ColorType::Grayscale);
        enc.set_depth(png::BitDepth::Eight);
        let mut wr = enc.write_header().map_err(|e| anyhow!("png: {e}"))?;
        wr.write_image_data(&px).map_err(|e| anyhow!("png: {e}"))?;
    }
    crate::write::write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn writes_a_decodable_png() {
        let p = std::env::temp_dir().join(format!("ember-plot-{}.png", std::process::id()));
        let r: Vec<(f64, f64)> = (1..=50).map(|s| (s as f64, (s as f64 / 50.0))).collect();
        let a = vec![(0.0, 0.2), (25.0, 0.5), (50.0, f64::NAN)];
        super::curves(&p, &r, &a).unwrap();
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&p).unwrap()));
        let info = dec.read_info().unwrap().info().clone();
        assert_eq!(
            (info.width, info.height),
            (super::W as u32, super::H as u32)
        );
        std::fs::remove_file(&p).ok();
    }
}
