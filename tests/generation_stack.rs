//! `Generation::stack` (Reinforce-Ada keeps responses from several rounds in one batch): the
//! stacked rows, re-padded to the widest prompt and response, rescore to the log-probs the
//! sampler recorded for them in their own rounds; scoring in chunks of rows changes nothing.

mod common;

use ember_llm::actor::LlmExperience;
use ember_llm::chartok;
use ember_llm::{Generation, SamplingConfig, generate};

#[test]
fn stacked_rows_rescore_like_their_rounds() {
    let device = common::dev();
    device.seed(7);
    let config = ember_llm::LlamaConfig::new(
        ember_llm::Family::Llama,
        chartok::vocab_size(),
        32,
        64,
        2,
        4,
        2,
    )
    .with_max_position_embeddings(64);
    let model = config.init(&device);
    let enc = |s: &str| {
        let mut v = vec![chartok::BOS];
        v.extend(chartok::encode(s).unwrap());
        v
    };
    let sc = |seed, max_new| SamplingConfig {
        temperature: 1.0,
        max_new_tokens: max_new,
        n: 3,
        seed,
        stop_tokens: vec![chartok::EOS],
        ..SamplingConfig::default()
    };
    // Two rounds with different prompt widths and response lengths.
    let a = generate(&model, &[enc("12+3="), enc("4+5=")], &sc(1, 4), &device).unwrap();
    let b = generate(&model, &[enc("123+456=")], &sc(2, 7), &device).unwrap();
    let (lp_a, lp_b) = (
        common::vals(a.log_probs.clone()),
        common::vals(b.log_probs.clone()),
    );
    let (na, nb) = (a.tokens.dims()[1], b.tokens.dims()[1]);
    let ids_a = a.response_ids();
    let ids_b = b.response_ids();
    let s = Generation::stack(vec![(a, vec![4, 0]), (b, vec![2])], vec![1, 0, 2]);
    assert_eq!(s.group_ids, vec![1, 0, 2]);
    assert_eq!(
        s.response_ids(),
        vec![ids_a[4].clone(), ids_a[0].clone(), ids_b[2].clone()]
    );
    let n = s.tokens.dims()[1];
    assert_eq!(n, na.max(nb));
    let (seq, mask) = s.sequences();
    let exp = LlmExperience {
        tokens: seq,
        mask,
        response_len: n,
        temperature: 1.0,
        adapters: true,
    };
    let rescored = common::vals(exp.score_all(&model) * s.mask.clone());
    // Scoring in chunks of rows gives the same values.
    let chunked = common::vals(exp.score_all_chunked(&model, 2) * s.mask.clone());
    for (a, b) in chunked.iter().zip(&rescored) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    let kept = common::vals(s.log_probs.clone() * s.mask.clone());
    let want: Vec<(usize, usize, &Vec<f32>, usize)> =
        vec![(0, 4, &lp_a, na), (1, 0, &lp_a, na), (2, 2, &lp_b, nb)];
    for (row, src, lp, w) in want {
        for j in 0..n {
            let sampled = if j < w { lp[src * w + j] } else { 0.0 };
            let m = common::vals(s.mask.clone())[row * n + j];
            assert_eq!(kept[row * n + j], sampled * m);
            assert!((rescored[row * n + j] - kept[row * n + j]).abs() < 1e-4);
        }
    }
}
