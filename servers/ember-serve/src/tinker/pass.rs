//! One `forward_backward` request's passes: its datums (read and checked), cut into passes of at
//! most [`PASS_TOKENS`] cells, each pass's log-probs, loss and gradients.
//!
//! When every datum of a pass has the next tokens as targets (Tinker's usual layout: the input
//! is a sequence but its last token, the targets the sequence but its first) and some datums
//! share a prefix (a group's samples share their prompt), the pass scores each distinct prefix
//! once (`Llama::shared_token_log_probs`): each datum's sequence split after the longest prefix
//! it shares with another, prefixes left-padded and the rest right-padded. Otherwise each datum
//! runs whole, its targets scored where they stand.

use super::loss::{LossFn, LossInputs, total};
use super::trainer::Client;
use super::wire::{self, ChunkKind};
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::Scoring;
use std::collections::HashMap;

/// Rows × positions of one forward and backward pass; a `forward_backward` request with more
/// runs in several passes whose gradients add up.
pub const PASS_TOKENS: usize = 8192;

/// One datum: input tokens, targets, and the loss's per-token inputs.
pub(super) struct Parsed {
    tokens: Vec<u32>,
    targets: Vec<u32>,
    inputs: HashMap<String, Vec<f32>>,
}

impl Parsed {
    pub(super) fn read(
        d: &wire::Datum,
        loss: &LossFn,
        vocab: usize,
        context: usize,
    ) -> Result<Self, String> {
        let mut tokens = Vec::new();
        for c in &d.model_input {
            match &c.chunk {
                Some(ChunkKind::EncodedText(t)) => tokens.extend(wire::tokens_from_i32(&t.tokens)?),
                Some(ChunkKind::Image(_)) => return Err("image chunks are not supported".into()),
                Some(ChunkKind::Dmel(_)) => return Err("dmel chunks are not supported".into()),
                None => {}
            }
        }
        let n = tokens.len();
        if n == 0 || n > context {
            return Err(format!("{n} input tokens (the model takes 1..={context})"));
        }
        if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(format!(
                "input token {t} is outside the vocabulary of {vocab}"
            ));
        }
        let get = |name: &str| -> Result<Vec<f64>, String> {
            let t = d
                .loss_fn_inputs
                .get(name)
                .ok_or_else(|| format!("loss_fn_inputs has no `{name}`"))?;
            let (v, shape) = wire::tensor_values(name, t, n).map_err(|e| {
                format!("{e} (one per input token; [N, K] targets are not supported)")
            })?;
            if shape != [n] {
                return Err(format!(
                    "loss_fn_inputs `{name}` has shape {shape:?}; the model input has {n} \
                     tokens (targets of shape [N, K] are not supported)"
                ));
            }
            Ok(v)
        };
        let targets = get("target_tokens")?
            .into_iter()
            .map(|v| {
                (v >= 0.0 && (v as usize) < vocab && v.fract() == 0.0)
                    .then_some(v as u32)
                    .ok_or_else(|| format!("target token {v} is outside the vocabulary of {vocab}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut inputs = HashMap::new();
        let mut names: Vec<&str> = loss.inputs().to_vec();
        if matches!(loss, LossFn::Gspo { .. })
            && d.loss_fn_inputs.contains_key("sequence_ratio_mask")
        {
            names.push("sequence_ratio_mask");
        }
        for name in names {
            let v = get(name)?;
            if v.iter().any(|x| !x.is_finite()) {
                return Err(format!("loss_fn_inputs `{name}` holds a non-finite value"));
            }
            inputs.insert(name.to_string(), v.into_iter().map(|x| x as f32).collect());
        }
        Ok(Self {
            tokens,
            targets,
            inputs,
        })
    }
}

/// Consecutive ranges of datums whose padded size stays within [`PASS_TOKENS`] (a datum longer
/// than that runs alone).
pub(super) fn passes(datums: &[Parsed]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut longest) = (0, 0);
    for (i, d) in datums.iter().enumerate() {
        let l = longest.max(d.tokens.len());
        if i > start && l * (i + 1 - start) > PASS_TOKENS {
            out.push(start..i);
            start = i;
            longest = d.tokens.len();
        } else {
            longest = l;
        }
    }
    out.push(start..datums.len());
    out
}

/// Where a pass's datums sit: the model's input (`tokens`, `mask` `[rows, columns]`), how it is
/// scored, and the column of each datum's first position in the `[rows, width]` log-probs.
struct Layout {
    tokens: Tensor<2, Int>,
    mask: Tensor<2>,
    /// Arbitrary targets (each datum whole), or the shared prefix's columns.
    how: Scored,
    offsets: Vec<usize>,
    width: usize,
}

enum Scored {
    Targets(Box<Tensor<2, Int>>),
    Shared(usize),
}

/// Each datum's split for shared scoring (the longest prefix it shares with another datum, at
/// least 1 and leaving at least one token after it), when every datum's targets are its next
/// tokens and some datums share a prefix.
fn prefix_split(datums: &[Parsed]) -> Option<(Vec<Vec<u32>>, Vec<usize>)> {
    let mut seqs = Vec::with_capacity(datums.len());
    for d in datums {
        let n = d.tokens.len();
        if d.targets[..n - 1] != d.tokens[1..] {
            return None;
        }
        seqs.push(
            d.tokens
                .iter()
                .chain(&d.targets[n - 1..])
                .copied()
                .collect::<Vec<u32>>(),
        );
    }
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by(|&a, &b| seqs[a].cmp(&seqs[b]));
    let lcp = |a: &[u32], b: &[u32]| a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let mut k = vec![0usize; seqs.len()];
    for w in order.windows(2) {
        let l = lcp(&seqs[w[0]], &seqs[w[1]]);
        k[w[0]] = k[w[0]].max(l);
        k[w[1]] = k[w[1]].max(l);
    }
    if k.iter().all(|&x| x < 2) {
        return None;
    }
    let k = k
        .iter()
        .zip(&seqs)
        .map(|(&k, s)| k.clamp(1, s.len() - 1))
        .collect();
    Some((seqs, k))
}

fn layout(datums: &[Parsed], device: &Device) -> Layout {
    let rows = datums.len();
    let ints =
        |v: Vec<i64>, w: usize| Tensor::<2, Int>::from_data(TensorData::new(v, [rows, w]), device);
    let floats =
        |v: Vec<f32>, w: usize| Tensor::<2>::from_data(TensorData::new(v, [rows, w]), device);
    if let Some((seqs, k)) = prefix_split(datums) {
        let p = k.iter().copied().max().unwrap_or(1);
        let n = seqs
            .iter()
            .zip(&k)
            .map(|(s, k)| s.len() - k)
            .max()
            .unwrap_or(1);
        let (mut t, mut m) = (Vec::with_capacity(rows * (p + n)), Vec::new());
        for (s, &k) in seqs.iter().zip(&k) {
            let (left, right) = (p - k, p + n - (p - k) - s.len());
            t.extend(std::iter::repeat_n(0, left).chain(s.iter().map(|&x| i64::from(x))));
            t.extend(std::iter::repeat_n(0, right));
            m.extend(std::iter::repeat_n(0.0, left).chain(std::iter::repeat_n(1.0, s.len())));
            m.extend(std::iter::repeat_n(0.0, right));
        }
        return Layout {
            tokens: ints(t, p + n),
            mask: floats(m, p + n),
            how: Scored::Shared(p),
            offsets: k.iter().map(|k| p - k).collect(),
            width: p + n - 1,
        };
    }
    let t = datums.iter().map(|d| d.tokens.len()).max().unwrap_or(1);
    let pad = |f: &dyn Fn(&Parsed) -> &[u32]| -> Vec<i64> {
        datums
            .iter()
            .flat_map(|d| {
                let s = f(d);
                s.iter()
                    .map(|&x| i64::from(x))
                    .chain(std::iter::repeat_n(0, t - s.len()))
            })
            .collect()
    };
    let mask = datums
        .iter()
        .flat_map(|d| {
            std::iter::repeat_n(1.0, d.tokens.len())
                .chain(std::iter::repeat_n(0.0, t - d.tokens.len()))
        })
        .collect();
    Layout {
        tokens: ints(pad(&|d| &d.tokens), t),
        mask: floats(mask, t),
        how: Scored::Targets(Box::new(ints(pad(&|d| &d.targets), t))),
        offsets: vec![0; rows],
        width: t,
    }
}

impl Layout {
    /// `[rows, width]` with each datum's `values` at its positions and 0 elsewhere.
    fn place(
        &self,
        datums: &[Parsed],
        values: &dyn Fn(&Parsed) -> Vec<f32>,
        device: &Device,
    ) -> Tensor<2> {
        let mut out = vec![0.0f32; datums.len() * self.width];
        for (r, (d, &o)) in datums.iter().zip(&self.offsets).enumerate() {
            let v = values(d);
            out[r * self.width + o..r * self.width + o + v.len()].copy_from_slice(&v);
        }
        Tensor::from_data(TensorData::new(out, [datums.len(), self.width]), device)
    }
}

/// One pass: the datums' log-probs (host values, each datum's own length) and loss; the
/// gradients added to the client's unless `forward_only`.
pub(super) fn run_pass(
    c: &mut Client,
    datums: &[Parsed],
    loss: &LossFn,
    device: &Device,
    forward_only: bool,
) -> Result<(Vec<Vec<f32>>, f64), String> {
    let l = layout(datums, device);
    let how = Scoring {
        temperature: 1.0,
        entropy: false,
        adapters: true,
    };
    let (lp, _) = match &l.how {
        Scored::Targets(targets) => {
            c.model
                .target_log_probs(l.tokens.clone(), l.mask.clone(), (**targets).clone(), how)
        }
        Scored::Shared(p) => {
            c.model
                .shared_token_log_probs(l.tokens.clone(), l.mask.clone(), *p, how)
        }
    };
    let mut names: Vec<String> = datums
        .iter()
        .flat_map(|d| d.inputs.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    // Every datum has the loss's own inputs; a datum without GSPO's ratio mask counts every
    // position in its ratio.
    let named = names
        .into_iter()
        .map(|k| {
            let v = |d: &Parsed| {
                d.inputs
                    .get(&k)
                    .cloned()
                    .unwrap_or_else(|| vec![1.0; d.tokens.len()])
            };
            let t = l.place(datums, &v, device);
            (k, t)
        })
        .collect();
    let x = LossInputs {
        log_probs: lp.clone(),
        mask: l.place(datums, &|d| vec![1.0; d.tokens.len()], device),
        named,
    };
    let sum = total(loss, &x)?;
    let host = lp
        .detach()
        .into_data()
        .try_into_vec::<f32>()
        .map_err(|e| format!("{e:?}"))?;
    let per_datum = datums
        .iter()
        .zip(&l.offsets)
        .enumerate()
        .map(|(r, (d, &o))| host[r * l.width + o..r * l.width + o + d.tokens.len()].to_vec())
        .collect();
    let value = f64::from(sum.clone().detach().into_scalar::<f32>());
    if !forward_only {
        c.add_gradients(sum);
    }
    Ok((per_datum, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datum(n: usize) -> Parsed {
        Parsed {
            tokens: vec![1; n],
            targets: vec![1; n],
            inputs: HashMap::new(),
        }
    }

    #[test]
    fn datums_split_after_the_prefix_they_share() {
        let d = |t: &[u32], last: u32| Parsed {
            tokens: t.to_vec(),
            targets: t[1..].iter().copied().chain([last]).collect(),
            inputs: HashMap::new(),
        };
        // Two samples of one prompt (5 6 7) diverging at once, one sharing a first response
        // token with the first sample, and one unrelated datum.
        let ds = [
            d(&[5, 6, 7, 1], 2),
            d(&[5, 6, 7, 3], 4),
            d(&[5, 6, 7, 1, 9], 9),
            d(&[8, 8], 8),
        ];
        let (seqs, k) = prefix_split(&ds).unwrap();
        assert_eq!(seqs[0], vec![5, 6, 7, 1, 2]);
        assert_eq!(k, vec![4, 3, 4, 1]);
        // A datum whose targets are not its next tokens: every datum runs whole.
        let mut odd = d(&[5, 6, 7], 1);
        odd.targets[0] = 9;
        assert!(prefix_split(&[d(&[5, 6, 7], 1), odd]).is_none());
        let l = layout(&ds, &Device::flex());
        assert_eq!((l.offsets.clone(), l.width), (vec![0, 1, 0, 3], 4 + 2 - 1));
    }

    #[test]
    fn passes_stay_within_the_cell_budget() {
        let ds: Vec<Parsed> = [4000, 4000, 100, 9000, 10].into_iter().map(datum).collect();
        assert_eq!(passes(&ds), vec![0..2, 2..3, 3..4, 4..5]);
        assert_eq!(passes(&ds[..1]), vec![0..1]);
    }
}
