//! The decode batch without its finished rows.
//!
//! At a stop check (one host read of the rows' alive flags, which the check makes anyway), once a
//! quarter or more of the rows being decoded have finished, they leave the batch: the KV cache,
//! the next tokens and the masks keep the live rows only, so later decode steps compute only
//! rows that still emit (vLLM's scheduler drops finished sequences the same way). What was
//! drawn is kept per segment of steps with the rows it had and put back in place at the end,
//! with zeros for the steps after a row finished, as the full batch writes them. Each step
//! still draws one uniform number per original row and hands each live row its own, so the
//! tokens drawn are the full batch's.

use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData};
use ember_engine::SplitMix64;

/// Steps drawn with one set of rows.
struct Segment {
    /// The original index of each row.
    rows: Vec<usize>,
    toks: Vec<Tensor<2, Int>>,
    lps: Vec<Tensor<2>>,
    masks: Vec<Tensor<2>>,
}

impl Segment {
    fn new(rows: Vec<usize>) -> Self {
        Self {
            rows,
            toks: Vec::new(),
            lps: Vec::new(),
            masks: Vec::new(),
        }
    }
}

/// The rows of a decode batch as they finish.
pub(crate) struct Shrinking {
    batch: usize,
    done: Vec<Segment>,
    now: Segment,
    /// Decode steps times rows computed.
    pub positions: usize,
}

impl Shrinking {
    /// A full batch of `batch` rows.
    pub fn new(batch: usize) -> Self {
        Self {
            batch,
            done: Vec::new(),
            now: Segment::new((0..batch).collect()),
            positions: 0,
        }
    }

    /// Rows in the batch now.
    pub fn rows(&self) -> usize {
        self.now.rows.len()
    }

    /// One uniform number for each row now at decode step `step`: draw `step × rows + row` of
    /// `seed`'s stream, as if every step drew one number for every original row in order
    /// (`rows_in`: these rows sit from `first` on in a batch of `rows`; default this batch).
    pub fn uniforms(&self, seed: u64, step: usize, rows_in: Option<(usize, usize)>) -> Vec<f32> {
        let (first, rows) = rows_in.unwrap_or((0, self.batch));
        let base = (step as u64).wrapping_mul(rows as u64) + first as u64;
        self.now
            .rows
            .iter()
            .map(|&r| SplitMix64::at(seed, base + r as u64).next_f32())
            .collect()
    }

    /// A step's tokens, log-probs and mask (`[rows now, 1]`).
    pub fn push(&mut self, tok: Tensor<2, Int>, lp: Tensor<2>, mask: Tensor<2>) {
        self.positions += self.rows();
        self.now.toks.push(tok);
        self.now.lps.push(lp);
        self.now.masks.push(mask);
    }

    /// The tokens of the last `k` steps (`[rows now, k]`).
    pub fn recent(&self, k: usize) -> Tensor<2, Int> {
        let toks = &self.now.toks;
        Tensor::cat(toks[toks.len().saturating_sub(k)..].to_vec(), 1)
    }

    /// The rows to keep, given each row's alive flag, when a quarter or more of them can go:
    /// the live rows, and finished ones (masked, as before) up to a multiple of `multiple` rows
    /// (a few batch shapes for GPU kernels); `None` to keep the batch as it is.
    pub fn worth_dropping(alive: &[f32], multiple: usize) -> Option<Vec<usize>> {
        let rows = alive.len();
        let (mut keep, dead): (Vec<usize>, Vec<usize>) = (0..rows).partition(|&i| alive[i] > 0.5);
        if keep.is_empty() {
            return None;
        }
        let want = keep.len().next_multiple_of(multiple.max(1)).min(rows);
        keep.extend(dead.into_iter().take(want - keep.len()));
        keep.sort_unstable();
        (4 * (rows - keep.len()) >= rows).then_some(keep)
    }

    /// Keeps rows `keep` (indices into the rows now) from the next step on; returns their
    /// indices as a tensor, to select the batch's own tensors with.
    pub fn keep(&mut self, keep: &[usize], device: &Device) -> Tensor<1, Int> {
        let rows = keep.iter().map(|&i| self.now.rows[i]).collect();
        let ended = std::mem::replace(&mut self.now, Segment::new(rows));
        self.done.push(ended);
        let idx: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
        Tensor::from_data(TensorData::new(idx, [keep.len()]), device)
    }

    /// Tokens, log-probs and masks `[batch, steps]`, every row in its place, and each original
    /// row's alive flag from `alive` (the rows now; finished rows are not alive).
    pub fn finish(
        mut self,
        alive: &[f32],
        device: &Device,
    ) -> (Tensor<2, Int>, Tensor<2>, Tensor<2>, Vec<bool>) {
        let mut truncated = vec![false; self.batch];
        for (&r, a) in self.now.rows.iter().zip(alive) {
            truncated[r] = *a > 0.5;
        }
        self.done.push(self.now);
        let b = self.batch;
        let (mut toks, mut lps, mut masks) = (Vec::new(), Vec::new(), Vec::new());
        for seg in self.done.into_iter().filter(|s| !s.toks.is_empty()) {
            let place = placer(&seg.rows, b, device);
            toks.push(place.int(Tensor::cat(seg.toks, 1)));
            lps.push(place.float(Tensor::cat(seg.lps, 1)));
            masks.push(place.float(Tensor::cat(seg.masks, 1)));
        }
        (
            Tensor::cat(toks, 1),
            Tensor::cat(lps, 1),
            Tensor::cat(masks, 1),
            truncated,
        )
    }
}

/// Puts a segment's `[rows, steps]` values back at their rows of the batch (zeros elsewhere).
struct Placer {
    idx: Option<Tensor<1, Int>>,
    batch: usize,
}

fn placer(rows: &[usize], batch: usize, device: &Device) -> Placer {
    let whole = rows.len() == batch && rows.iter().enumerate().all(|(i, &r)| i == r);
    let idx = (!whole).then(|| {
        let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
        Tensor::from_data(TensorData::new(idx, [rows.len()]), device)
    });
    Placer { idx, batch }
}

impl Placer {
    fn float(&self, t: Tensor<2>) -> Tensor<2> {
        match &self.idx {
            None => t,
            Some(idx) => {
                let zeros = Tensor::<2>::zeros([self.batch, t.dims()[1]], &t.device());
                zeros.select_assign(0, idx.clone(), t, IndexingUpdateOp::Add)
            }
        }
    }

    fn int(&self, t: Tensor<2, Int>) -> Tensor<2, Int> {
        match &self.idx {
            None => t,
            Some(idx) => {
                let zeros = Tensor::<2, Int>::zeros([self.batch, t.dims()[1]], &t.device());
                zeros.select_assign(0, idx.clone(), t, IndexingUpdateOp::Add)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Shrinking;

    #[test]
    fn a_quarter_finished_leaves_rounded_to_the_multiple() {
        let flags = |s: &str| -> Vec<f32> { s.chars().map(|c| f32::from(c == '1')).collect() };
        // 8 rows, 2 finished: a quarter leaves.
        assert_eq!(
            Shrinking::worth_dropping(&flags("10111011"), 1),
            Some(vec![0, 2, 3, 4, 6, 7])
        );
        // 1 of 8 finished: not worth it; none alive: nothing to keep.
        assert_eq!(Shrinking::worth_dropping(&flags("11111011"), 1), None);
        assert_eq!(Shrinking::worth_dropping(&flags("00000000"), 1), None);
        // 16 rows, 5 alive, a multiple of 4: the 5 live rows and the first 3 finished ones.
        let alive = flags("0100110000010001");
        assert_eq!(
            Shrinking::worth_dropping(&alive, 4),
            Some(vec![0, 1, 2, 3, 4, 5, 11, 15])
        );
        // 8 rows, 5 alive, a multiple of 8: all 8 stay, so nothing changes.
        assert_eq!(Shrinking::worth_dropping(&flags("11101101"), 8), None);
    }
}
