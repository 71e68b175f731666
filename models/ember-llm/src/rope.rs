//! Rotary position embeddings: the inverse frequencies (plain, or scaled as Llama 3.x, linear
//! interpolation and YaRN define them in transformers' `modeling_rope_utils.py`) and the
//! rotate-half application of HF `apply_rotary_pos_emb`.

use crate::error::LlmError;
use burn::tensor::{Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use serde_json::Value;

type Res<T> = std::result::Result<T, LlmError>;

/// A scaled RoPE variant (`rope_scaling` of transformers < 5, `rope_parameters` of ≥ 5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// Position interpolation: every frequency divided by `factor` (HF `_compute_linear_scaling_rope_parameters`).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's band-wise scaling (HF `_compute_llama3_parameters`).
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The pre-training context.
        original_max_position_embeddings: f64,
    },
    /// YaRN (Peng et al. 2023, eqs. 17–23; HF `_compute_yarn_parameters`): a ramp between
    /// interpolated and extrapolated frequencies and a temperature on cos/sin.
    Yarn {
        /// Context extension factor s.
        factor: f64,
        /// The pre-training context L.
        original_max_position_embeddings: f64,
        /// α: rotations above which frequencies are extrapolated.
        beta_fast: f64,
        /// β: rotations below which frequencies are interpolated.
        beta_slow: f64,
        /// The cos/sin multiplier (√(1/t)); computed from `factor` when absent.
        attention_factor: Option<f64>,
        /// DeepSeek's mscale pair (used when both are set and `attention_factor` is absent).
        mscale: Option<f64>,
        /// See `mscale`.
        mscale_all_dim: Option<f64>,
        /// Round the ramp's ends to whole dimensions (HF `truncate`, default true).
        truncate: bool,
    },
    /// Per-frequency divisors stored in a GGUF file (`rope_freqs.weight`, llama.cpp's form of
    /// the Llama 3 scaling).
    Factors {
        /// One divisor per frequency (`head_dim / 2`).
        factors: Vec<f32>,
    },
}

fn num(p: &Value, key: &str) -> Option<f64> {
    p.get(key).and_then(Value::as_f64)
}

fn need(p: &Value, key: &'static str) -> Res<f64> {
    num(p, key)
        .filter(|v| v.is_finite() && *v > 0.0)
        .ok_or(LlmError::Config {
            field: "rope_scaling",
            reason: format!("`{key}` is missing or not a positive number"),
        })
}

impl RopeScaling {
    /// Reads a `rope_scaling` / `rope_parameters` object; `None` for the default RoPE.
    /// `max_positions` is the config's `max_position_embeddings` (YaRN's fallback for L).
    pub fn from_hf(p: &Value, max_positions: usize) -> Res<Option<Self>> {
        let bad = |reason: String| LlmError::Config {
            field: "rope_scaling",
            reason,
        };
        let kind = p
            .get("rope_type")
            .or_else(|| p.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if let Some(f) = num(p, "partial_rotary_factor").filter(|f| *f != 1.0) {
            return Err(bad(format!("partial_rotary_factor {f} is not supported")));
        }
        Ok(Some(match kind {
            "default" => return Ok(None),
            "linear" => Self::Linear {
                factor: need(p, "factor")?,
            },
            "llama3" => Self::Llama3 {
                factor: need(p, "factor")?,
                low_freq_factor: need(p, "low_freq_factor")?,
                high_freq_factor: need(p, "high_freq_factor")?,
                original_max_position_embeddings: need(p, "original_max_position_embeddings")?,
            },
            "yarn" => {
                let old = num(p, "original_max_position_embeddings")
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .unwrap_or(max_positions as f64);
                // transformers 5: without `factor`, the ratio of the two contexts.
                let factor = match p.get("factor") {
                    None | Some(Value::Null) => max_positions as f64 / old,
                    Some(_) => need(p, "factor")?,
                };
                Self::yarn(p, factor, old)
            }
            other => {
                return Err(bad(format!(
                    "rope type `{other}` is not supported (supported: default, linear, llama3, \
                     yarn; `dynamic` rescales by the running sequence length and is not)"
                )));
            }
        }))
    }

    fn yarn(p: &Value, factor: f64, old: f64) -> Self {
        Self::Yarn {
            factor,
            original_max_position_embeddings: old,
            beta_fast: num(p, "beta_fast").filter(|b| *b != 0.0).unwrap_or(32.0),
            beta_slow: num(p, "beta_slow").filter(|b| *b != 0.0).unwrap_or(1.0),
            attention_factor: num(p, "attention_factor"),
            mscale: num(p, "mscale"),
            mscale_all_dim: num(p, "mscale_all_dim"),
            truncate: p.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        }
    }

    /// The `rope_scaling` object transformers reads back.
    pub fn to_hf(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The plain inverse frequencies θ^(−2i/d), i < d/2 (RoFormer, Su et al. 2021, eq. 15).
fn plain(theta: f64, head_dim: usize) -> Vec<f64> {
    (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf(2.0 * i as f64 / head_dim as f64))
        .collect()
}

/// YaRN's mscale: 0.1·m·ln(s) + 1 for s > 1 (HF `get_mscale`).
fn yarn_mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

/// The inverse frequencies and the cos/sin multiplier of `scaling` over head size `d`.
pub fn inv_freq(theta: f64, d: usize, scaling: Option<&RopeScaling>) -> (Vec<f32>, f32) {
    let base = plain(theta, d);
    let (inv, attn): (Vec<f64>, f64) = match scaling {
        None => (base, 1.0),
        Some(RopeScaling::Linear { factor }) => (base.iter().map(|f| f / factor).collect(), 1.0),
        Some(RopeScaling::Factors { factors }) => (
            base.iter()
                .zip(factors)
                .map(|(f, s)| f / f64::from(*s))
                .collect(),
            1.0,
        ),
        Some(&RopeScaling::Llama3 {
            factor,
            low_freq_factor: lo,
            high_freq_factor: hi,
            original_max_position_embeddings: old,
        }) => (
            base.iter()
                .map(|&f| llama3_freq(f, factor, lo, hi, old))
                .collect(),
            1.0,
        ),
        Some(y @ RopeScaling::Yarn { .. }) => yarn(theta, d, y),
    };
    (inv.into_iter().map(|f| f as f32).collect(), attn as f32)
}

/// One Llama 3 frequency: divided by `factor` beyond the low-frequency wavelength, kept below
/// the high-frequency one, and smoothly mixed between (HF `_compute_llama3_parameters`).
fn llama3_freq(f: f64, factor: f64, lo: f64, hi: f64, old: f64) -> f64 {
    let wavelen = 2.0 * std::f64::consts::PI / f;
    if wavelen > old / lo {
        f / factor
    } else if wavelen < old / hi {
        f
    } else {
        let smooth = (old / wavelen - lo) / (hi - lo);
        (1.0 - smooth) * f / factor + smooth * f
    }
}

/// YaRN's frequencies and attention factor (HF `_compute_yarn_parameters`).
fn yarn(theta: f64, d: usize, y: &RopeScaling) -> (Vec<f64>, f64) {
    let &RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: old,
        beta_fast,
        beta_slow,
        attention_factor,
        mscale,
        mscale_all_dim,
        truncate,
    } = y
    else {
        return (plain(theta, d), 1.0);
    };
    let attn = attention_factor.unwrap_or(match (mscale, mscale_all_dim) {
        (Some(m), Some(a)) if m != 0.0 && a != 0.0 => {
            yarn_mscale(factor, m) / yarn_mscale(factor, a)
        }
        _ => yarn_mscale(factor, 1.0),
    });
    // The dimension whose wavelength makes `rot` rotations over the original context.
    let dim_of =
        |rot: f64| d as f64 * (old / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * theta.ln());
    let (mut low, mut high) = (dim_of(beta_fast), dim_of(beta_slow));
    if truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, high) = (low.max(0.0), high.min(d as f64 - 1.0));
    let high = if low == high { high + 0.001 } else { high };
    let inv = plain(theta, d)
        .iter()
        .enumerate()
        .map(|(i, &extra)| {
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            extra / factor * (1.0 - keep) + extra * keep
        })
        .collect();
    (inv, attn)
}

/// cos and signed-sin tables `[batch, 1, seq, head_dim]` for positions `[batch, seq]`
/// (rotate-half layout: the frequencies repeated twice, HF `LlamaRotaryEmbedding`, both scaled
/// by the attention factor; the sin table's first half negated for [`apply_rope`]).
pub(crate) fn rope_tables(
    positions: Tensor<2, Int>,
    inv: &[f32],
    scale: f32,
) -> (Tensor<4>, Tensor<4>) {
    let [b, t] = positions.dims();
    let device = positions.device();
    let half = inv.len();
    let head_dim = 2 * half;
    let inv = Tensor::<1>::from_data(TensorData::new(inv.to_vec(), [half]), &device)
        .reshape([1, 1, half]);
    let freqs = positions.float().reshape([b, t, 1]) * inv;
    let emb = Tensor::cat(vec![freqs.clone(), freqs.clone()], 2).reshape([b, 1, t, head_dim]);
    // sin with its first half negated: rotate_half(x)·sin = swap_halves(x)·[−sin₁, sin₂].
    let sin = freqs.sin();
    let signed_sin = Tensor::cat(vec![sin.clone().neg(), sin], 2).reshape([b, 1, t, head_dim]);
    if scale == 1.0 {
        (emb.cos(), signed_sin)
    } else {
        (emb.cos().mul_scalar(scale), signed_sin.mul_scalar(scale))
    }
}

/// x·cos + rotate_half(x)·sin with rotate_half(x) = [−x₂, x₁] (HF `apply_rotary_pos_emb`),
/// computed as x·cos + [x₂, x₁]·signed_sin with `signed_sin` = [−sin, sin] from
/// [`rope_tables`]: `ember_kernels::op::rope` (a kernel where one runs, else the halves swapped
/// by one concatenation, no negation).
pub(crate) fn apply_rope(x: Tensor<4>, cos: &Tensor<4>, signed_sin: &Tensor<4>) -> Tensor<4> {
    ember_kernels::op::rope(x, cos, signed_sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_bands_divide_keep_and_mix_by_hand() {
        // old = 8, lo = 1, hi = 4: wavelengths > 8 divided by 4, < 2 kept, between mixed.
        let two_pi = 2.0 * std::f64::consts::PI;
        assert_eq!(
            llama3_freq(two_pi / 16.0, 4.0, 1.0, 4.0, 8.0),
            two_pi / 16.0 / 4.0
        );
        assert_eq!(llama3_freq(two_pi, 4.0, 1.0, 4.0, 8.0), two_pi);
        // wavelength 4: smooth = (8/4 − 1)/(4 − 1) = 1/3; f = 2/3·f/4 + 1/3·f = f/2.
        let f = two_pi / 4.0;
        assert!((llama3_freq(f, 4.0, 1.0, 4.0, 8.0) - f / 2.0).abs() < 1e-12);
    }

    #[test]
    fn yarn_attention_factor_is_the_mscale_of_the_factor() {
        let y = RopeScaling::from_hf(&serde_json::json!({"rope_type": "yarn", "factor": 4.0}), 64)
            .unwrap()
            .unwrap();
        let (inv, attn) = inv_freq(10000.0, 8, Some(&y));
        assert!((f64::from(attn) - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-6);
        // L = 64, d = 8, θ = 1e4: low = floor(8·ln(64/(32·2π))/(2·ln 1e4)) = floor(−0.50) → 0,
        // high = ceil(8·ln(64/2π)/(2 ln 1e4)) = ceil(1.008) = 2: frequency 0 extrapolated,
        // 1 half-way, 2 and 3 interpolated (divided by 4).
        let p = plain(10000.0, 8);
        let want = [p[0], 0.5 * p[1] + 0.5 * p[1] / 4.0, p[2] / 4.0, p[3] / 4.0];
        for (a, b) in inv.iter().zip(want) {
            assert!((f64::from(*a) - b).abs() < 1e-7 * b.max(1e-3), "{a} vs {b}");
        }
    }

    #[test]
    fn unknown_and_dynamic_rope_types_are_refused_by_name() {
        for t in ["dynamic", "longrope", "su"] {
            let e = RopeScaling::from_hf(&serde_json::json!({"rope_type": t, "factor": 2.0}), 64)
                .unwrap_err()
                .to_string();
            assert!(e.contains(t), "{e}");
        }
        let e = RopeScaling::from_hf(
            &serde_json::json!({"rope_type": "llama3", "factor": 8.0}),
            64,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("low_freq_factor"), "{e}");
        assert_eq!(
            RopeScaling::from_hf(
                &serde_json::json!({"rope_type": "default", "rope_theta": 1e4}),
                64
            )
            .unwrap(),
            None
        );
    }
}
