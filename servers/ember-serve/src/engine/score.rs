//! Scoring (`echo`) as work the engine interleaves with decoding: a request's sequences are cut
//! into units of at most `--prefill-chunk-tokens` positions (short sequences batched together, a
//! longer one in chunks that attend to the keys the earlier chunks left in a KV cache), and the
//! engine runs one unit between two decode steps, the requests taking turns. So a long prompt
//! delays the running batch by one unit at most, no scoring request starves another, and one
//! whose client has gone stops at its next turn (a 4 000-token prompt used to hold the engine
//! in one forward pass, minutes on a CPU, after its client had left).

use super::{Engine, ScoreJob, ScoreReply, Scores};
use crate::api::ApiError;
use axum::http::StatusCode;
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_llm::Llama;
use ember_llm::cache::KvCache;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};

impl ScoreJob {
    /// `seqs` to score under `model`, in units of at most `chunk` positions.
    pub(crate) fn new(model: String, seqs: Vec<Vec<u32>>, reply: ScoreReply, chunk: usize) -> Self {
        Self {
            groups: score_chunks(&seqs, chunk).into(),
            model,
            seqs,
            reply,
            chunk,
            out: Vec::new(),
            long: None,
        }
    }

    /// The client has gone.
    fn gone(&self) -> bool {
        self.reply.is_closed()
    }

    /// Runs the next unit; true once every sequence is scored.
    fn unit(&mut self, model: &Llama, device: &Device) -> Result<bool, String> {
        let Some(range) = self.groups.front().cloned() else {
            return Ok(true);
        };
        let seq = &self.seqs[range.start];
        if range.len() == 1 && seq.len() > self.chunk {
            let (cache, start, scores) = self.long.get_or_insert_with(|| {
                let cache = KvCache::new(model.cache_shape(), 1, seq.len(), device);
                (cache, 0, Vec::with_capacity(seq.len()))
            });
            let end = (*start + self.chunk).min(seq.len());
            scores.extend(chunk_scores(model, seq, *start..end, cache, device)?);
            *start = end;
            if end == seq.len() {
                if let Some((_, _, scores)) = self.long.take() {
                    self.out.push(scores);
                }
                self.groups.pop_front();
            }
        } else {
            self.out
                .extend(score_batch(model, &self.seqs[range], device)?);
            self.groups.pop_front();
        }
        Ok(self.groups.is_empty())
    }

    fn fail(self, message: &str) {
        let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message);
        let _ = self.reply.send(Err(e));
    }
}

impl Engine {
    /// Queues a scoring request (answered at once when its model is unknown).
    pub(super) fn enqueue_score(&mut self, model: String, seqs: Vec<Vec<u32>>, reply: ScoreReply) {
        if self.model(&model).is_none() {
            let served = self.names.read().map(|n| n.clone()).unwrap_or_default();
            let _ = reply.send(Err(ApiError::no_model(&model, &served)));
            return;
        }
        let chunk = self.chunk_tokens;
        self.scoring
            .push_back(ScoreJob::new(model, seqs, reply, chunk));
    }

    /// One unit of the scoring request whose turn it is (requests whose client has gone are
    /// dropped first); it is answered when done, or goes to the back of the line.
    pub(super) fn score_unit(&mut self) {
        self.scoring.retain(|j| !j.gone());
        let Some(mut job) = self.scoring.pop_front() else {
            return;
        };
        let Some(model) = self.model(&job.model) else {
            return job.fail("the model was unloaded while scoring");
        };
        let device = &self.device;
        match catch_unwind(AssertUnwindSafe(|| job.unit(model, device))) {
            Ok(Ok(true)) => {
                let _ = job.reply.send(Ok(job.out));
            }
            Ok(Ok(false)) => self.scoring.push_back(job),
            Ok(Err(e)) => job.fail(&e),
            Err(_) => job.fail("scoring failed (the model panicked)"),
        }
    }
}

/// [`Scores`] of `seq`'s positions `range`, run through the model after the positions `cache`
/// already holds (the earlier chunks); the sequence's last position predicts nothing.
fn chunk_scores(
    model: &Llama,
    seq: &[u32],
    range: Range<usize>,
    cache: &mut KvCache,
    device: &Device,
) -> Result<Scores, String> {
    let (a, t) = (range.start, range.len());
    let ids: Vec<i64> = seq[range].iter().map(|&x| i64::from(x)).collect();
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [1, t]), device);
    let mask = Tensor::<2>::ones([1, t], device);
    let logits = model.forward_cached_all(tokens, mask, cache);
    let n = t.min(seq.len().saturating_sub(a + 1));
    if n == 0 {
        return Ok(Vec::new());
    }
    let next: Vec<i64> = seq[a + 1..a + 1 + n]
        .iter()
        .map(|&x| i64::from(x))
        .collect();
    let targets = Tensor::<3, Int>::from_data(TensorData::new(next, [1, n, 1]), device);
    let v = logits.dims()[2];
    let at = picked_and_top(logits.slice([0..1, 0..n, 0..v]), targets)?;
    Ok((0..n).map(|i| at(0, i)).collect())
}

/// For logits `[b, w, vocab]` and the next tokens `targets` `[b, w, 1]`: a reader of row `r`,
/// position `i`'s (next token's log-prob, the most likely token, its log-prob), after one host
/// read of all of them.
fn picked_and_top(
    logits: Tensor<3>,
    targets: Tensor<3, Int>,
) -> Result<impl Fn(usize, usize) -> (f32, u32, f32), String> {
    let [b, w, _] = logits.dims();
    let lsm = log_softmax(logits, 2);
    let picked = lsm.clone().gather(2, targets).reshape([b, w]);
    let (top, arg) = lsm.max_dim_with_indices(2);
    let rows = Tensor::cat(
        vec![picked, top.reshape([b, w]), arg.reshape([b, w]).float()],
        0,
    );
    let host = rows
        .into_data()
        .try_to_vec::<f32>()
        .map_err(|e| format!("reading scores back: {e:?}"))?;
    let at = move |block: usize, r: usize, i: usize| host[(block * b + r) * w + i];
    Ok(move |r: usize, i: usize| (at(0, r, i), at(2, r, i) as u32, at(1, r, i)))
}

/// Consecutive ranges of `seqs` whose padded size (rows × the longest) stays within `budget`
/// positions; a longer sequence is a range of its own.
fn score_chunks(seqs: &[Vec<u32>], budget: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut longest) = (0, 0);
    for (i, s) in seqs.iter().enumerate() {
        let l = longest.max(s.len());
        if i > start && (i - start + 1) * l > budget {
            out.push(start..i);
            (start, longest) = (i, s.len());
        } else {
            longest = l;
        }
    }
    if start < seqs.len() {
        out.push(start..seqs.len());
    }
    out
}

/// [`Scores`] of right-padded `seqs` in one forward pass: for each position, the next token's
/// log-prob, the most likely token and its log-prob (a sequence under 2 tokens has none).
fn score_batch(model: &Llama, seqs: &[Vec<u32>], device: &Device) -> Result<Vec<Scores>, String> {
    let b = seqs.len();
    let t = seqs.iter().map(Vec::len).max().unwrap_or(0);
    if t < 2 {
        return Ok(vec![Vec::new(); b]);
    }
    let mut ids = vec![0i64; b * t];
    let mut m = vec![0f32; b * t];
    for (r, s) in seqs.iter().enumerate() {
        for (i, &x) in s.iter().enumerate() {
            ids[r * t + i] = i64::from(x);
            m[r * t + i] = 1.0;
        }
    }
    let tokens = Tensor::<2, Int>::from_data(TensorData::new(ids, [b, t]), device);
    let mask = Tensor::<2>::from_data(TensorData::new(m, [b, t]), device);
    let logits = model.forward(tokens.clone(), mask);
    let v = logits.dims()[2];
    let targets = tokens.slice([0..b, 1..t]).reshape([b, t - 1, 1]);
    let at = picked_and_top(logits.slice([0..b, 0..t - 1, 0..v]), targets)?;
    Ok(seqs
        .iter()
        .enumerate()
        .map(|(r, s)| (0..s.len().saturating_sub(1)).map(|i| at(r, i)).collect())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Chunks keep the order, cover every sequence once and stay within the position budget
    /// (a longer sequence alone).
    #[test]
    fn score_chunks_cover_in_order_within_the_budget() {
        let seqs: Vec<Vec<u32>> = [10, 500, 600, 3000, 2, 2, 1024, 1024]
            .iter()
            .map(|&n| vec![1; n])
            .collect();
        let chunks = score_chunks(&seqs, 2048);
        // 3 × 600 fits; 3000 alone; 3 × 1024 does not fit, 2 × 1024 = 2048 does.
        assert_eq!(chunks, vec![0..3, 3..4, 4..6, 6..8]);
        assert!(score_chunks(&[], 2048).is_empty());
    }

    /// A long sequence scored in chunks through the KV cache, a unit at a time, gives the
    /// scores of one forward pass over it (to float rounding), and short ones batched beside
    /// it keep theirs.
    #[test]
    fn chunks_through_the_cache_score_as_one_pass() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/llm/tiny_llama");
        let device = burn::tensor::Device::flex();
        let model = ember_llm::load(&dir, &device).unwrap().model;
        let vocab = model.vocab_size() as u32;
        let seq = |n: u32, k: u32| -> Vec<u32> { (0..n).map(|i| (i * k + 3) % vocab).collect() };
        let seqs = vec![seq(5, 7), seq(41, 13), seq(3, 5), seq(2, 11)];
        let whole: Vec<Scores> = seqs
            .iter()
            .flat_map(|s| score_batch(&model, std::slice::from_ref(s), &device).unwrap())
            .collect();
        let (reply, _rx) = tokio::sync::oneshot::channel();
        let mut job = ScoreJob::new("m".into(), seqs.clone(), reply, 8);
        let mut units = 1;
        while !job.unit(&model, &device).unwrap() {
            units += 1;
        }
        // [5] and [3, 2] batched; 41 positions in chunks of 8.
        assert_eq!(units, 1 + 6 + 1, "{units}");
        assert_eq!(job.out.len(), seqs.len());
        for (got, want) in job.out.iter().zip(&whole) {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g.0 - w.0).abs() < 1e-4 && (g.2 - w.2).abs() < 1e-4,
                    "{g:?} {w:?}"
                );
                assert_eq!(g.1, w.1);
            }
        }
    }
}
