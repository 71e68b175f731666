//! What the model answers: the answer position's log-probs of a set of facts, and the
//! `forget/*` and `retain/*` metrics a run logs.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor};
use ember_llm::Llama;
use ember_tasks::facts::{Facts, exposure};
use std::collections::BTreeMap;

/// `[rows]` values of a tensor on the host, flattened.
pub(super) fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.try_into_vec_as::<f32>().unwrap_or_default()
}

/// `[facts, vocab]` log-probs of the answer position (after `<sep>`) for `facts`' prompts.
pub(super) fn answer_log_probs(
    model: &Llama,
    f: &Facts,
    facts: &[usize],
    device: &Device,
) -> Tensor<2> {
    let prompts: Vec<Vec<u32>> = facts.iter().map(|i| f.facts[*i].prompt.clone()).collect();
    let (tokens, mask) = ember_llm::left_pad(&prompts, device);
    let [b, t] = tokens.dims();
    let logits = model.forward(tokens, mask);
    let v = logits.dims()[2];
    log_softmax(logits.slice([0..b, t - 1..t, 0..v]).reshape([b, v]), 1)
}

/// `forget/*` and `retain/*`: greedy accuracy (the most likely word is the answer), refusal
/// rate, mean log π(answer) and mean exposure of the answer among its attribute's values.
pub(super) fn evaluate(model: &Llama, f: &Facts, device: &Device) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let v = f.vocab_size();
    for (name, set) in [("forget", &f.forget), ("retain", &f.retain)] {
        let lp = host(answer_log_probs(model, f, set, device));
        let (mut acc, mut refuse, mut ll, mut exp) = (0.0, 0.0, 0.0, 0.0);
        for (r, i) in set.iter().enumerate() {
            let row = &lp[r * v..(r + 1) * v];
            let fact = &f.facts[*i];
            let best = (0..v)
                .max_by(|a, b| row[*a].total_cmp(&row[*b]))
                .unwrap_or(0);
            acc += f64::from(u8::from(best == fact.answer as usize));
            refuse += f64::from(u8::from(best == f.refusal as usize));
            ll += f64::from(row[fact.answer as usize]);
            let rank = 1 + fact
                .candidates
                .iter()
                .filter(|c| row[**c as usize] > row[fact.answer as usize])
                .count();
            exp += exposure(rank, fact.candidates.len());
        }
        let n = set.len().max(1) as f64;
        out.insert(format!("{name}/accuracy"), acc / n);
        out.insert(format!("{name}/refusal"), refuse / n);
        out.insert(format!("{name}/log_likelihood"), ll / n);
        out.insert(format!("{name}/exposure"), exp / n);
    }
    out
}
