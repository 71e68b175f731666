//! Masked reductions, group statistics and scans over `[batch, steps]` tensors.
//!
//! Everything here stays on the device: no value is read back to the host.

use burn::tensor::{Bool, Device, Tensor, TensorData};

/// Sum of `x · mask` over all elements. verl `masked_sum`.
pub fn masked_sum<const D: usize>(x: Tensor<D>, mask: Tensor<D>) -> Tensor<1> {
    (x * mask).sum()
}

/// Mean of `x` over the elements where `mask` is 1 (0 when the mask is empty). verl `masked_mean`.
pub fn masked_mean<const D: usize>(x: Tensor<D>, mask: Tensor<D>) -> Tensor<1> {
    let count = mask.clone().sum().clamp_min(1.0);
    masked_sum(x, mask) / count
}

/// Masked variance; `unbiased` divides by `n − 1` (verl `masked_var`, which also uses Bessel's
/// correction by default). Returns 0 for fewer than two valid elements.
pub fn masked_var<const D: usize>(x: Tensor<D>, mask: Tensor<D>, unbiased: bool) -> Tensor<1> {
    let mean = masked_mean(x.clone(), mask.clone());
    let centred = x - mean.reshape([1; D]);
    let ss = masked_sum(centred.clone() * centred, mask.clone());
    let count = mask.sum();
    let denom = if unbiased {
        count.sub_scalar(1.0)
    } else {
        count
    };
    ss / denom.clamp_min(1.0)
}

/// Whitening over valid elements: `(x − mean) / sqrt(var + 1e-8)`, var unbiased; elements
/// outside the mask are returned as 0. verl `masked_whiten` (shift_mean=True).
pub fn masked_whiten<const D: usize>(x: Tensor<D>, mask: Tensor<D>) -> Tensor<D> {
    let mean = masked_mean(x.clone(), mask.clone()).reshape([1; D]);
    let var = masked_var(x.clone(), mask.clone(), true).reshape([1; D]);
    (x - mean) / var.add_scalar(1e-8).sqrt() * mask
}

/// Discounted suffix sum along steps: `y_t = Σ_{s≥t} γ^{s−t} x_s`, the reward-to-go of
/// REINFORCE++ and the GAE recursion `A_t = δ_t + γλ A_{t+1}` (Schulman et al. 2016, eq. 16).
///
/// Computed as a Hillis–Steele scan in ⌈log₂ steps⌉ shifted adds, exact for any γ and
/// without the `γ^{-t}` rescaling that overflows on long sequences.
///
/// # Shapes
/// `x`: `[batch, steps]` → `[batch, steps]`.
pub fn discounted_suffix_sum(x: Tensor<2>, gamma: f32) -> Tensor<2> {
    let [batch, steps] = x.dims();
    let device = x.device();
    let mut y = x;
    let mut k = 1usize;
    let mut gk = gamma;
    while k < steps {
        let shifted = Tensor::cat(
            vec![
                y.clone().slice([0..batch, k..steps]),
                Tensor::zeros([batch, k], &device),
            ],
            1,
        );
        y = y + shifted * gk;
        k *= 2;
        gk *= gk;
    }
    y
}

/// The reverse affine scan y_t = a_t·y_{t+1} + b_t with y_T = 0, per row, in ⌈log₂ T⌉ doubling
/// steps on the device (each step composes the maps of two spans: (A, B)∘(A', B') =
/// (A·A', B + A·B')). With a_t = γ·m_t + (1 − m_t) and b_t = x_t·m_t it is a discounted suffix
/// sum that skips the steps where m_t = 0 (carrying y across them), as verl's GAE loop does.
///
/// # Shapes
/// `a`, `b`: `[batch, steps]` → `[batch, steps]`.
pub fn reverse_affine_scan(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    let [batch, steps] = b.dims();
    let device = b.device();
    let (mut a, mut y) = (a, b);
    let mut k = 1usize;
    while k < steps {
        let shift = |t: Tensor<2>, fill: f32| {
            Tensor::cat(
                vec![
                    t.slice([0..batch, k..steps]),
                    Tensor::full([batch, k], fill, &device),
                ],
                1,
            )
        };
        // Past the end the map is the identity (A = 1, B = 0): y_T = 0 stays 0.
        let (a_next, y_next) = (shift(a.clone(), 1.0), shift(y.clone(), 0.0));
        y = y + a.clone() * y_next;
        a = a * a_next;
        k *= 2;
    }
    y
}

/// 1 at the last valid step of each row, 0 elsewhere: `mask · [Σ_{s≥t} mask_s = 1]`.
///
/// # Shapes
/// `mask`: `[batch, steps]` → `[batch, steps]`.
pub fn last_step_indicator(mask: Tensor<2>) -> Tensor<2> {
    let remaining = mask.clone().flip([1]).cumsum(1).flip([1]);
    remaining.equal_elem(1.0).float() * mask
}

/// Shifts a `[batch, steps]` tensor one step to the left, filling the last column with zeros:
/// `y_t = x_{t+1}`.
pub fn shift_left(x: Tensor<2>) -> Tensor<2> {
    let [batch, steps] = x.dims();
    let device = x.device();
    Tensor::cat(
        vec![
            x.slice([0..batch, 1..steps]),
            Tensor::zeros([batch, 1], &device),
        ],
        1,
    )
}

/// Samples grouped by prompt: a dense relabelling of the caller's group ids plus a
/// `[batch, groups]` one-hot membership matrix, so group statistics are matrix products.
#[derive(Debug, Clone)]
pub struct Groups {
    ids: Vec<usize>,
    n_groups: usize,
    one_hot: Tensor<2>,
}

impl Groups {
    /// Builds the membership of `group_ids` (any labels; equal labels share a group).
    pub fn new(group_ids: &[usize], device: &Device) -> Self {
        let mut map = std::collections::HashMap::new();
        let ids: Vec<usize> = group_ids
            .iter()
            .map(|g| {
                let next = map.len();
                *map.entry(*g).or_insert(next)
            })
            .collect();
        let n_groups = map.len().max(1);
        let batch = ids.len();
        let mut data = vec![0f32; batch * n_groups];
        for (i, g) in ids.iter().enumerate() {
            data[i * n_groups + g] = 1.0;
        }
        let one_hot = Tensor::from_data(TensorData::new(data, [batch, n_groups]), device);
        Self {
            ids,
            n_groups,
            one_hot,
        }
    }

    /// Dense group index of each sample.
    pub fn ids(&self) -> &[usize] {
        &self.ids
    }

    /// Number of distinct groups.
    pub fn len(&self) -> usize {
        self.n_groups
    }

    /// True when there are no samples.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The `[batch, groups]` membership matrix.
    pub fn one_hot(&self) -> &Tensor<2> {
        &self.one_hot
    }

    /// Per-group sums of a per-sample value: `[batch]` → `[groups]`.
    pub fn sum(&self, x: Tensor<1>) -> Tensor<1> {
        let [batch] = x.dims();
        x.reshape([1, batch])
            .matmul(self.one_hot.clone())
            .reshape([self.n_groups])
    }

    /// Gives each sample its group's value: `[groups]` → `[batch]`.
    pub fn broadcast(&self, g: Tensor<1>) -> Tensor<1> {
        let batch = self.ids.len();
        self.one_hot
            .clone()
            .matmul(g.reshape([self.n_groups, 1]))
            .reshape([batch])
    }

    /// Per-sample sum over its group of `x · weight`.
    pub fn group_sum(&self, x: Tensor<1>, weight: Tensor<1>) -> Tensor<1> {
        self.broadcast(self.sum(x * weight))
    }

    /// Per-sample group mean of `x` over samples with `weight = 1` (0 where the group has none).
    pub fn group_mean(&self, x: Tensor<1>, weight: Tensor<1>) -> Tensor<1> {
        let count = self.group_sum(weight.clone().ones_like(), weight.clone());
        self.group_sum(x, weight) / count.clamp_min(1.0)
    }

    /// Per-sample group variance (population or unbiased) over weighted samples.
    pub fn group_var(&self, x: Tensor<1>, weight: Tensor<1>, unbiased: bool) -> Tensor<1> {
        let mean = self.group_mean(x.clone(), weight.clone());
        let centred = x - mean;
        let ss = self.group_sum(centred.clone() * centred, weight.clone());
        let count = self.group_sum(weight.clone().ones_like(), weight);
        let denom = if unbiased {
            count.sub_scalar(1.0)
        } else {
            count
        };
        ss / denom.clamp_min(1.0)
    }

    /// Per-sample count of weighted samples in its group.
    pub fn group_count(&self, weight: Tensor<1>) -> Tensor<1> {
        self.group_sum(weight.clone().ones_like(), weight)
    }

    /// True for samples whose group's weighted values are all equal (exactly, not up to
    /// rounding), including singleton groups and groups with no weighted sample.
    pub fn zero_range(&self, x: Tensor<1>, weight: Tensor<1>) -> Tensor<1, Bool> {
        let batch = self.ids.len();
        let member = (self.one_hot.clone() * weight.reshape([batch, 1])).equal_elem(0.0);
        let xs = x.reshape([batch, 1]).expand([batch, self.n_groups]);
        let max = xs
            .clone()
            .mask_fill(member.clone(), f32::NEG_INFINITY)
            .max_dim(0);
        let min = xs.mask_fill(member, f32::INFINITY).min_dim(0);
        let flat = (max - min).reshape([self.n_groups]);
        // A group without members has max−min = −inf: treat it as zero range too.
        let zero = flat.clone().equal_elem(0.0).bool_or(flat.is_inf());
        self.broadcast(zero.float()).greater_elem(0.5)
    }
}
