//! Continuous batching (`ember_llm::running`): rows that join a running decode batch at any
//! step, leave it as they finish, and move when the buffer is compacted or grown, draw what
//! they would draw alone.

mod common;

use ember_llm::running::{Drawn, Finish, Limits, RowSampling, RowSpec, Running};
use ember_llm::{Llama, SamplingConfig, chartok, generate};
use std::collections::BTreeMap;

fn model() -> Llama {
    let device = common::dev();
    device.seed(11);
    ember_llm::LlamaConfig::new(
        ember_llm::Family::Llama,
        chartok::vocab_size(),
        32,
        64,
        2,
        4,
        2,
    )
    .with_max_position_embeddings(128)
    .init(&device)
}

fn enc(s: &str) -> Vec<u32> {
    let mut v = vec![chartok::BOS];
    v.extend(chartok::encode(s).unwrap());
    v
}

fn greedy() -> RowSampling {
    RowSampling {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
    }
}

fn row(tag: u64, prompt: &str, max_tokens: usize, sampling: RowSampling) -> RowSpec {
    RowSpec {
        tag,
        prompt: enc(prompt),
        max_tokens,
        stop_tokens: vec![chartok::EOS],
        sampling,
        seed: 1000 + tag,
    }
}

/// Runs `plan` (step → rows joining before that step) to the end; each tag's tokens and
/// log-probs, and the largest (slots, positions) the buffer held.
fn run(
    model: &Llama,
    limits: Limits,
    mut plan: BTreeMap<usize, Vec<RowSpec>>,
) -> (BTreeMap<u64, Vec<Drawn>>, (usize, usize)) {
    let mut batch = Running::new(model, limits, &common::dev()).unwrap();
    let mut out: BTreeMap<u64, Vec<Drawn>> = BTreeMap::new();
    let mut peak = (0, 0);
    let mut waiting: Vec<RowSpec> = Vec::new();
    for step in 0..200 {
        waiting.extend(plan.remove(&step).unwrap_or_default());
        // The rows that arrived join in order while they fit (as the server schedules).
        let mut join = Vec::new();
        while let Some(r) = waiting.first() {
            let mut sizes: Vec<_> = join
                .iter()
                .map(|r: &RowSpec| (r.prompt.len(), r.max_tokens))
                .collect();
            sizes.push((r.prompt.len(), r.max_tokens));
            if !batch.fits(&sizes) {
                break;
            }
            join.push(waiting.remove(0));
        }
        batch.admit(model, join).unwrap();
        let (s, c) = batch.footprint();
        peak = (peak.0.max(s), peak.1.max(c));
        for d in batch.step(model).unwrap() {
            out.entry(d.tag).or_default().push(d);
        }
        if plan.is_empty() && waiting.is_empty() && batch.is_empty() {
            break;
        }
    }
    assert!(batch.is_empty(), "rows still decoding after 200 steps");
    (out, peak)
}

/// Greedy rows that join at steps 0, 3, 5 and 9 (prompts of 3 to 12 tokens, up to 20 new
/// tokens) under tight limits, so that slots are reused, the buffer is compacted and grown,
/// equal `generate` of each prompt alone: the same tokens, log-probs within 1e-4, and each row
/// ends at its own stop token or `max_tokens`.
#[test]
fn rows_joining_and_leaving_draw_what_they_draw_alone() {
    let model = model();
    let g = greedy();
    let rows = [
        (0, row(0, "12+3=", 20, g)),
        (0, row(1, "7*8=", 4, g)),
        (3, row(2, "123+456+789=", 12, g)),
        (5, row(3, "9-", 6, g)),
        (5, row(4, "12+3=", 9, g)),
        (9, row(5, "55+66=", 15, g)),
        (22, row(6, "8*7=", 18, g)),
    ];
    let mut plan: BTreeMap<usize, Vec<RowSpec>> = BTreeMap::new();
    for (at, r) in rows.iter().cloned() {
        plan.entry(at).or_default().push(r);
    }
    let limits = Limits {
        max_rows: 4,
        max_cells: 4 * 40,
        bucket: 8,
    };
    let (out, peak) = run(&model, limits, plan);
    assert!(peak.0 <= 4 && peak.0 * peak.1 <= 160, "peak {peak:?}");
    for (_, r) in &rows {
        let cfg = SamplingConfig {
            temperature: 0.0,
            max_new_tokens: r.max_tokens,
            stop_tokens: r.stop_tokens.clone(),
            ..SamplingConfig::default()
        };
        let alone = generate(
            &model,
            std::slice::from_ref(&r.prompt),
            &cfg,
            &common::dev(),
        )
        .unwrap();
        let want = alone.response_ids().remove(0);
        let want_lp = common::vals(alone.log_probs.clone());
        let got = &out[&r.tag];
        let tokens: Vec<u32> = got.iter().map(|d| d.token).collect();
        assert_eq!(tokens, want, "row {}", r.tag);
        for (d, lp) in got.iter().zip(&want_lp) {
            assert!(
                (d.log_prob - lp).abs() < 1e-4,
                "row {}: {} vs {lp}",
                r.tag,
                d.log_prob
            );
        }
        let last = got.last().unwrap();
        let ended = if tokens.len() < r.max_tokens || last.token == chartok::EOS {
            Finish::Stop
        } else {
            Finish::Length
        };
        assert_eq!(last.finished, Some(ended), "row {}", r.tag);
        assert!(got[..got.len() - 1].iter().all(|d| d.finished.is_none()));
    }
}

/// A sampled row (its own seed, top-k and top-p) draws the same tokens whether it decodes alone
/// or beside rows with other settings that join and leave around it.
#[test]
fn a_sampled_row_does_not_depend_on_its_neighbours() {
    let model = model();
    let s = RowSampling {
        temperature: 0.9,
        top_k: 20,
        top_p: 0.95,
        min_p: 0.0,
    };
    let other = RowSampling {
        temperature: 1.3,
        top_k: 0,
        top_p: 0.8,
        min_p: 0.05,
    };
    let limits = Limits {
        max_rows: 8,
        max_cells: 4096,
        bucket: 16,
    };
    let alone = run(
        &model,
        limits,
        BTreeMap::from([(0, vec![row(7, "31+4=", 16, s)])]),
    )
    .0;
    let crowd = BTreeMap::from([
        (0, vec![row(1, "1+1=", 3, other), row(7, "31+4=", 16, s)]),
        (
            2,
            vec![row(2, "99*99=", 10, greedy()), row(3, "5+", 5, other)],
        ),
        (6, vec![row(4, "123=", 8, s)]),
    ]);
    let beside = run(&model, limits, crowd).0;
    let toks = |m: &BTreeMap<u64, Vec<Drawn>>| m[&7].iter().map(|d| d.token).collect::<Vec<_>>();
    assert_eq!(toks(&alone), toks(&beside));
    assert_eq!(beside.len(), 5);
}

/// Limits are kept and bad rows (the temperature by the samplers' one rule) are errors, not
/// panics; a cancelled row frees its slot.
#[test]
fn limits_bad_rows_and_cancel() {
    let model = model();
    let limits = Limits {
        max_rows: 2,
        max_cells: 2 * 32,
        bucket: 8,
    };
    let mut batch = Running::new(&model, limits, &common::dev()).unwrap();
    assert!(
        !batch.fits(&[(3, 4), (3, 4), (3, 4)]),
        "three rows > max_rows 2"
    );
    assert!(!batch.fits(&[(60, 10)]), "70 positions > 64 cells");
    assert!(batch.fits(&[(10, 10)]));
    let bad = RowSpec {
        prompt: Vec::new(),
        ..row(0, "", 4, greedy())
    };
    assert!(batch.admit(&model, vec![bad]).is_err());
    let outside = RowSpec {
        prompt: vec![chartok::vocab_size() as u32],
        ..row(0, "", 4, greedy())
    };
    assert!(batch.admit(&model, vec![outside]).is_err());
    let mut huge = row(0, "1+1=", 4, greedy());
    huge.sampling.top_p = 0.0;
    assert!(batch.admit(&model, vec![huge]).is_err());
    // The one temperature rule of every sampler (`ember_llm`'s `temperature_ok`): above 100 is
    // refused here as by `SamplingConfig` (this batcher used to take any finite value).
    for t in [100.5, f32::NAN, -1.0] {
        let mut hot = row(0, "1+1=", 4, greedy());
        hot.sampling.temperature = t;
        let e = batch.admit(&model, vec![hot]).unwrap_err().to_string();
        assert!(e.contains("bad sampling settings"), "{t}: {e}");
    }
    assert!(
        batch
            .admit(&model, vec![row(0, "1+1=", 70, greedy())])
            .is_err()
    );
    // No stop token: the rows' lengths must not depend on the weights, which parallel tests
    // drawing from the backend's one seeded generator can change.
    let endless = |tag, prompt| RowSpec {
        stop_tokens: Vec::new(),
        ..row(tag, prompt, 10, greedy())
    };
    batch
        .admit(&model, vec![endless(1, "1+1="), endless(2, "2+2=")])
        .unwrap();
    assert_eq!(batch.live(), 2);
    assert!(!batch.fits(&[(3, 3)]));
    batch.step(&model).unwrap();
    batch.cancel(|t| t == 1);
    assert_eq!(batch.live(), 1);
    assert!(batch.fits(&[(3, 3)]));
    let drawn = batch.step(&model).unwrap();
    assert!(drawn.iter().all(|d| d.tag == 2));
    batch.cancel(|_| true);
    assert!(batch.is_empty());
    assert!(batch.step(&model).unwrap().is_empty());
}

/// A joiner prefilled a chunk of columns at a time (3 here), while the row already in the batch
/// goes on decoding between the chunks, draws what it draws when prefilled at once, and so does
/// the row that kept decoding (greedy; log-probs to float rounding).
#[test]
fn a_prompt_prefilled_in_chunks_between_steps_draws_as_prefilled_at_once() {
    let model = model();
    let limits = Limits {
        max_rows: 4,
        max_cells: 4096,
        bucket: 8,
    };
    let first = || row(1, "12+34=", 24, greedy());
    let joiners = || {
        vec![
            row(2, "9+8=17,3+4=7,1+1=", 10, greedy()),
            row(3, "5+5=", 10, greedy()),
        ]
    };
    let draw_all = |batch: &mut Running, out: &mut BTreeMap<u64, Vec<Drawn>>| {
        for d in batch.step(&model).unwrap() {
            out.entry(d.tag).or_default().push(d);
        }
    };
    // At once: the joiners admitted after two steps of the first row.
    let mut once = Running::new(&model, limits, &common::dev()).unwrap();
    let mut a: BTreeMap<u64, Vec<Drawn>> = BTreeMap::new();
    once.admit(&model, vec![first()]).unwrap();
    draw_all(&mut once, &mut a);
    draw_all(&mut once, &mut a);
    once.admit(&model, joiners()).unwrap();
    while !once.is_empty() {
        draw_all(&mut once, &mut a);
    }
    // In chunks: the same joiners begun after two steps, a chunk of 3 columns per step.
    let mut chunked = Running::new(&model, limits, &common::dev()).unwrap();
    let mut b: BTreeMap<u64, Vec<Drawn>> = BTreeMap::new();
    chunked.admit(&model, vec![first()]).unwrap();
    draw_all(&mut chunked, &mut b);
    let mut pre = chunked.begin(joiners()).unwrap().unwrap();
    assert_eq!(pre.tags(), vec![2, 3]);
    let mut chunks = 0;
    while !pre.is_done() {
        chunked.prefill(&model, &mut pre, 3);
        chunks += 1;
        if chunks == 1 {
            draw_all(&mut chunked, &mut b);
        }
    }
    // 18 columns (BOS and the longer prompt's 17 characters) in chunks of 3.
    assert_eq!(chunks, 6);
    chunked.finish(pre).unwrap();
    while !chunked.is_empty() {
        draw_all(&mut chunked, &mut b);
    }
    for tag in [1, 2, 3] {
        let (x, y) = (&a[&tag], &b[&tag]);
        let tokens = |v: &Vec<Drawn>| v.iter().map(|d| d.token).collect::<Vec<_>>();
        assert_eq!(tokens(x), tokens(y), "row {tag}");
        for (p, q) in x.iter().zip(y) {
            assert!(
                (p.log_prob - q.log_prob).abs() < 1e-4,
                "row {tag}: {p:?} {q:?}"
            );
        }
    }
}
