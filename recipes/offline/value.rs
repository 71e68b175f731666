//! A-LoL's value estimate V_ref(x) (Baheti et al. 2023, §2.1: a value head on the frozen
//! reference's representation of the prompt, regressed on the rewards of the reference's own
//! responses): here a linear head on the reference's final (normed) hidden state before the
//! response, fitted by ridge regression on every valid (prompt, reward) of the file.
//!
//! LoL-RL (`lolrl_qlora_llama_hh.py`, `train_value_function_on_val_predictions`) trains an
//! attention-pooled head over the prompt's hidden states with AdamW (lr 1e-5, 10 epochs, the
//! epoch of lowest MSE kept). A linear head on the state a causal model carries into the
//! response is the same regression with a closed-form minimiser: no learning rate or epochs to
//! choose, the same V on every run. What it buys is the common case of offline data: one scored
//! response per prompt, where a prompt's mean reward is no baseline at all.

use crate::lm::Policy;
use crate::lm::step::{TokenRow, rows_generation};
use crate::offline::data::TokGroup;
use anyhow::{Result, anyhow, bail};
use burn::module::Module;
use burn::tensor::Device;
use ember_llm::Llama;

/// The ridge penalty per sample on the head's weights (not its bias): λ = `RIDGE`·n.
pub const RIDGE: f64 = 1e-3;

/// Prompts per forward pass of the reference.
const CHUNK: usize = 256;

/// The fitted head's V(x) of every group (0 for the groups without a valid reward) and its fit:
/// the mean squared error over the valid responses, and that of the mean reward alone.
#[derive(Debug, Clone)]
pub struct ValueEstimate {
    pub values: Vec<f32>,
    pub mse: f64,
    pub mse_of_mean: f64,
}

/// V(x) for the `usable` groups: their prompt states under the reference (the tiny policy's
/// frozen copy, or a LoRA policy with adapters off), the head fitted on their valid rewards.
pub fn value_estimate(
    groups: &[TokGroup],
    usable: &[usize],
    reference: Option<&Llama>,
    policy: &Policy,
    base: &Device,
) -> Result<ValueEstimate> {
    let states = prompt_states(groups, usable, reference, policy, base)?;
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    for (k, &gi) in usable.iter().enumerate() {
        for r in groups[gi]
            .rewards
            .iter()
            .filter(|r| ember_engine::is_valid_reward((**r).into()))
        {
            xs.push(&states[k][..]);
            ys.push(f64::from(*r));
        }
    }
    let head = fit_ridge(&xs, &ys, RIDGE)?;
    let mut values = vec![0.0f32; groups.len()];
    for (k, &gi) in usable.iter().enumerate() {
        values[gi] = head.predict(&states[k]) as f32;
    }
    let mean = ys.iter().sum::<f64>() / ys.len() as f64;
    let sq = |f: &dyn Fn(usize) -> f64| {
        (0..ys.len()).map(|i| (ys[i] - f(i)).powi(2)).sum::<f64>() / ys.len() as f64
    };
    Ok(ValueEstimate {
        mse: sq(&|i| head.predict(xs[i])),
        mse_of_mean: sq(&|_| mean),
        values,
    })
}

/// Each usable group's prompt state: the reference's final hidden state at the prompt's last
/// position (causal: the response does not change it), read in chunks, `[usable][d_model]`.
fn prompt_states(
    groups: &[TokGroup],
    usable: &[usize],
    reference: Option<&Llama>,
    policy: &Policy,
    base: &Device,
) -> Result<Vec<Vec<f32>>> {
    let sampler = policy.model.valid();
    let model = reference.unwrap_or(&sampler);
    let mut out = Vec::with_capacity(usable.len());
    for chunk in usable.chunks(CHUNK) {
        let rows: Vec<TokenRow> = chunk
            .iter()
            .map(|&gi| TokenRow {
                prompt: &groups[gi].prompt,
                response: &groups[gi].responses[0],
                log_probs: None,
                truncated: false,
            })
            .collect();
        let g = rows_generation(&rows, (0..rows.len()).collect(), base);
        let (seq, mask) = g.sequences();
        let n = g.tokens.dims()[1];
        let h = model.last_hidden(seq, mask, n, reference.is_some());
        let [b, _, d] = h.dims();
        let v: Vec<f32> = h
            .slice([0..b, 0..1, 0..d])
            .try_into_vec_as::<f32>()
            .map_err(|e| anyhow!("reading the reference's prompt states: {e:?}"))?;
        out.extend(v.chunks(d).map(<[f32]>::to_vec));
    }
    Ok(out)
}

/// A linear head: V(x) = w·x + b.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearHead {
    pub w: Vec<f64>,
    pub b: f64,
}

impl LinearHead {
    pub fn predict(&self, x: &[f32]) -> f64 {
        self.b
            + self
                .w
                .iter()
                .zip(x)
                .map(|(w, x)| w * f64::from(*x))
                .sum::<f64>()
    }
}

/// Ridge regression (Hoerl & Kennard 1970): min_w,b Σ_i (y_i − w·x_i − b)² + λ‖w‖², λ =
/// `ridge`·n, solved on centred data: (X̄ᵀX̄ + λI) w = X̄ᵀȳ by Cholesky, b = ȳ − w·x̄.
pub fn fit_ridge(xs: &[&[f32]], ys: &[f64], ridge: f64) -> Result<LinearHead> {
    let n = xs.len();
    if n == 0 || n != ys.len() {
        bail!(
            "a value head needs one reward per state ({n} states, {} rewards)",
            ys.len()
        );
    }
    let d = xs[0].len();
    let mean_x: Vec<f64> = (0..d)
        .map(|j| xs.iter().map(|x| f64::from(x[j])).sum::<f64>() / n as f64)
        .collect();
    let mean_y = ys.iter().sum::<f64>() / n as f64;
    let mut a = vec![0.0f64; d * d];
    let mut rhs = vec![0.0f64; d];
    for (x, y) in xs.iter().zip(ys) {
        let c: Vec<f64> = (0..d).map(|j| f64::from(x[j]) - mean_x[j]).collect();
        for i in 0..d {
            rhs[i] += c[i] * (y - mean_y);
            for j in 0..=i {
                a[i * d + j] += c[i] * c[j];
            }
        }
    }
    for i in 0..d {
        a[i * d + i] += ridge * n as f64 + f64::EPSILON;
    }
    let w = cholesky_solve(&mut a, rhs, d)?;
    let b = mean_y - w.iter().zip(&mean_x).map(|(w, m)| w * m).sum::<f64>();
    Ok(LinearHead { w, b })
}

/// Solves A w = rhs for a symmetric positive-definite A (lower triangle in `a`, row-major,
/// overwritten by its Cholesky factor L): L Lᵀ w = rhs by two triangular solves.
fn cholesky_solve(a: &mut [f64], mut rhs: Vec<f64>, d: usize) -> Result<Vec<f64>> {
    for j in 0..d {
        let diag = a[j * d + j] - (0..j).map(|k| a[j * d + k].powi(2)).sum::<f64>();
        if !(diag > 0.0 && diag.is_finite()) {
            bail!("the value head's normal equations are not positive definite (column {j})");
        }
        let l = diag.sqrt();
        a[j * d + j] = l;
        for i in j + 1..d {
            let s = a[i * d + j] - (0..j).map(|k| a[i * d + k] * a[j * d + k]).sum::<f64>();
            a[i * d + j] = s / l;
        }
    }
    for i in 0..d {
        let s = rhs[i] - (0..i).map(|k| a[i * d + k] * rhs[k]).sum::<f64>();
        rhs[i] = s / a[i * d + i];
    }
    for i in (0..d).rev() {
        let s = rhs[i] - (i + 1..d).map(|k| a[k * d + i] * rhs[k]).sum::<f64>();
        rhs[i] = s / a[i * d + i];
    }
    Ok(rhs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// y = 2·x₀ − x₁ + 0.5 on four points: with a vanishing penalty the fit recovers it to
    /// rounding; with λ = n·1 by hand on one feature (x = −1, 1; y = −1, 1): w = Σxy/(Σx² + λ)
    /// = 2/(2 + 2) = 0.5, b = 0.
    #[test]
    fn ridge_recovers_a_linear_target_and_shrinks_by_hand() {
        let pts: [[f32; 2]; 4] = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 2.0]];
        let xs: Vec<&[f32]> = pts.iter().map(|p| &p[..]).collect();
        let ys: Vec<f64> = pts
            .iter()
            .map(|p| 2.0 * f64::from(p[0]) - f64::from(p[1]) + 0.5)
            .collect();
        let h = fit_ridge(&xs, &ys, 1e-12).unwrap();
        assert!(
            (h.w[0] - 2.0).abs() < 1e-6 && (h.w[1] + 1.0).abs() < 1e-6,
            "{h:?}"
        );
        assert!((h.b - 0.5).abs() < 1e-6, "{h:?}");
        let one: [[f32; 1]; 2] = [[-1.0], [1.0]];
        let xs: Vec<&[f32]> = one.iter().map(|p| &p[..]).collect();
        let h = fit_ridge(&xs, &[-1.0, 1.0], 1.0).unwrap();
        assert!((h.w[0] - 0.5).abs() < 1e-12 && h.b.abs() < 1e-12, "{h:?}");
        assert!(fit_ridge(&[], &[], 1.0).is_err());
    }
}
