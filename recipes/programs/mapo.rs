//! MAPO's rows (Memory Augmented Policy Optimization, Liang et al. 2018): the objective
//! π_B·E_{a∼π⁺_B}[R] + (1 − π_B)·E_{a∼π⁻_B}[R] split at the question's buffer B of good
//! programs, the buffer's weight clipped below at 0.1, estimated with one buffer program drawn
//! in proportion to π (stratified sampling) and the step's samples outside the buffer.

use super::job::{Programs, experience};
use super::methods::{self, Best};
use super::state::ProgramsJob;
use burn::module::Module;
use ember_train::Actor;

impl ProgramsJob<'_> {
    /// The rows and advantages of MAPO for the step's questions `qs` (`samples` each in
    /// `sampled`, their `rewards`), from the memory before this step's samples join it.
    pub(super) fn mapo_rows(
        &mut self,
        qs: &[usize],
        sampled: &Programs,
        rewards: &[f32],
    ) -> (Programs, Vec<f32>) {
        let k = self.r.train.run.samples_per_prompt;
        let buffers: Vec<Vec<Best>> = qs
            .iter()
            .map(|q| self.memory.get(q).cloned().unwrap_or_default())
            .collect();
        let probs = self.program_probs(qs, &buffers);
        let (mut rows, mut groups) = (Programs::new(), Vec::new());
        let mut at = 0;
        for (g, (q, buffer)) in qs.iter().zip(&buffers).enumerate() {
            let p = &probs[at..at + buffer.len()];
            at += buffer.len();
            let outside: Vec<usize> = (g * k..(g + 1) * k)
                .filter(|i| !buffer.iter().any(|b| b.program == sampled[*i].1))
                .collect();
            let w = if outside.is_empty() {
                1.0
            } else {
                methods::mapo_weight(p)
            };
            let mut group = Vec::new();
            if let Some(pick) = self.draw_in_proportion(p) {
                rows.push((*q, buffer[pick].program.clone()));
                group.push((w, buffer[pick].reward));
            }
            for i in &outside {
                rows.push(sampled[*i].clone());
                group.push(((1.0 - w) / outside.len() as f32, rewards[*i]));
            }
            groups.push(group);
        }
        (rows, methods::weighted_advantages(&groups))
    }

    /// π(a) of every buffer program under the current policy (buffers in order), from one
    /// masked scoring pass.
    fn program_probs(&self, qs: &[usize], buffers: &[Vec<Best>]) -> Vec<f32> {
        let rows: Programs = qs
            .iter()
            .zip(buffers)
            .flat_map(|(q, b)| b.iter().map(|x| (*q, x.program.clone())))
            .collect();
        if rows.is_empty() {
            return Vec::new();
        }
        let t = self.r.train.run.temperature;
        let exp = experience(&self.task, &rows, t, &self.base);
        let all: Vec<usize> = (0..rows.len()).collect();
        let lp = self.model.valid().score(&exp, &all, false).log_probs;
        let [b, n] = lp.dims();
        let cols = exp.tokens.dims()[1];
        let mask = exp.mask.clone().slice([0..b, cols - n..cols]);
        let seq = (lp * mask).sum_dim(1);
        let host = seq.try_into_vec_as::<f32>().unwrap_or_default();
        host.iter().map(|l| l.exp()).collect()
    }

    /// An index drawn in proportion to `p` (uniform when every entry is 0; none when empty).
    fn draw_in_proportion(&mut self, p: &[f32]) -> Option<usize> {
        if p.is_empty() {
            return None;
        }
        let total: f32 = p.iter().sum();
        if !(total.is_finite() && total > 0.0) {
            return Some(self.rng.below(p.len() as u64) as usize);
        }
        let u = self.rng.next_f32() * total;
        let mut acc = 0.0;
        for (i, x) in p.iter().enumerate() {
            acc += x;
            if u < acc {
                return Some(i);
            }
        }
        Some(p.len() - 1)
    }
}
