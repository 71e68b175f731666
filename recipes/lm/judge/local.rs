//! The judge loaded in process: a frozen model on the run's device, its words scored as an
//! endpoint's `echo` scores them.

use super::spec::JudgeSpec;
use super::yes_probability;
use crate::lm::participant::Loaded;
use anyhow::Result;
use burn::tensor::{Int, Tensor, TensorData};
use ember_llm::Scoring;

impl Loaded {
    /// P(yes) against P(no) for each prompt: from one batched forward pass when each word is
    /// one token after the same prompt tokens, else one pass per word.
    pub(super) fn yes_no(&self, prompts: &[String], spec: &JudgeSpec) -> Result<Vec<f32>> {
        if let Some(v) = self.one_pass(prompts, spec)? {
            return Ok(v);
        }
        let lp_yes = self.word_log_probs(prompts, &spec.yes)?;
        let lp_no = self.word_log_probs(prompts, &spec.no)?;
        Ok(lp_yes
            .iter()
            .zip(&lp_no)
            .map(|(&y, &n)| yes_probability(y, n))
            .collect())
    }

    /// [`Self::yes_no`] from the next-token distribution after each prompt, when both words are
    /// single tokens that follow the same prompt tokens (None otherwise).
    fn one_pass(&self, prompts: &[String], spec: &JudgeSpec) -> Result<Option<Vec<f32>>> {
        let mut rows = Vec::with_capacity(prompts.len());
        let mut words = Vec::with_capacity(prompts.len());
        for p in prompts {
            let a = self.tok.encode(&format!("{p}{}", spec.yes))?;
            let b = self.tok.encode(&format!("{p}{}", spec.no))?;
            let (Some((&y, ya)), Some((&n, nb))) = (a.split_last(), b.split_last()) else {
                return Ok(None);
            };
            let single =
                |id: u32, w: &str| self.tok.decode(&[id], false).ok().as_deref() == Some(w);
            if ya.is_empty() || ya != nb || !single(y, &spec.yes) || !single(n, &spec.no) {
                return Ok(None);
            }
            rows.push(ya.to_vec());
            words.push([y as i64, n as i64]);
        }
        let (tokens, mask) = ember_llm::left_pad(&rows, &self.device);
        let logits = self.model.forward_with(tokens, mask, false);
        let [b, t, v] = logits.dims();
        let last = logits.slice([0..b, t - 1..t, 0..v]).reshape([b, v]);
        let lp = burn::tensor::activation::log_softmax(last, 1);
        let ids =
            Tensor::<2, Int>::from_data(TensorData::new(words.concat(), [b, 2]), &self.device);
        let picked = lp
            .gather(1, ids)
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("reading the judge's log-probs: {e:?}"))?;
        let out = picked
            .chunks(2)
            .map(|yn| yes_probability(yn[0].into(), yn[1].into()))
            .collect();
        Ok(Some(out))
    }

    /// The log-probability of `word` after each prompt: the prompt and the word tokenized
    /// together, as an endpoint's `echo` does, and the word's trailing tokens summed.
    fn word_log_probs(&self, prompts: &[String], word: &str) -> Result<Vec<f64>> {
        let mut rows = Vec::with_capacity(prompts.len());
        let mut ks = Vec::with_capacity(prompts.len());
        for p in prompts {
            let ids = self.tok.encode(&format!("{p}{word}"))?;
            let is_word = |k: &usize| {
                self.tok
                    .decode(&ids[ids.len() - k..], false)
                    .ok()
                    .as_deref()
                    == Some(word)
            };
            let k = (1..ids.len()).find(is_word).ok_or_else(|| {
                anyhow::anyhow!(
                    "the judge's tokens do not end with {word:?} on a token boundary (its \
                     tokenizer merged it with the prompt's end)"
                )
            })?;
            rows.push(ids);
            ks.push(k);
        }
        let n = ks.iter().copied().max().unwrap_or(1);
        let (tokens, mask) = ember_llm::left_pad(&rows, &self.device);
        let (lps, _) = self.model.last_log_probs(
            tokens,
            mask,
            n,
            Scoring {
                temperature: 1.0,
                entropy: false,
                adapters: false,
            },
        );
        let data = lps
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("reading the judge's log-probs: {e:?}"))?;
        let row_sum = |(i, &k): (usize, &usize)| -> f64 {
            data[i * n + n - k..(i + 1) * n]
                .iter()
                .map(|&x| f64::from(x))
                .sum()
        };
        Ok(ks.iter().enumerate().map(row_sum).collect())
    }
}
