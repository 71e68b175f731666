//! Environments: the Python example of the JSON-lines protocol plays exactly like the built-in
//! game it re-implements, and a failing environment program gets a named error.

use ember_tasks::env::builtin::GuessNumber;
use ember_tasks::env::external::{ExternalEnv, ExternalEnvSpec};
use ember_tasks::env::{EnvError, Environment, Episode, EpisodeSource};
use std::path::Path;

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/envs/guess_number.py")
        .to_string_lossy()
        .into()
}

/// Forty held-out episodes through both, turn by turn, with guesses that bisect, repeat, miss
/// the range or hold no number: identical observations, rewards and ends.
#[test]
fn python_example_env_equals_the_builtin() {
    let spec = ExternalEnvSpec {
        command: vec![
            "python3".into(),
            example(),
            "--max".into(),
            "31".into(),
            "--turns".into(),
            "6".into(),
        ],
        timeout_s: 30.0,
    };
    let mut py = ExternalEnv::spawn(&spec).unwrap();
    let mut rs = GuessNumber::new(31, 6);
    let episodes: Vec<Episode> = EpisodeSource::held_out_set(40)
        .into_iter()
        .enumerate()
        .map(|(id, seed)| Episode { id, seed })
        .collect();
    assert_eq!(py.reset(&episodes).unwrap(), rs.reset(&episodes).unwrap());
    let mut bounds: Vec<(i64, i64)> = vec![(0, 31); episodes.len()];
    let mut running: Vec<usize> = (0..episodes.len()).collect();
    let mut solved = 0;
    for turn in 0..6 {
        let actions: Vec<(usize, String)> = running
            .iter()
            .map(|&i| {
                let (lo, hi) = bounds[i];
                let text = match (i + turn) % 5 {
                    0 => String::new(),
                    1 => "40".into(),
                    _ => format!(" {}", (lo + hi) / 2),
                };
                (i, text)
            })
            .collect();
        let a = py.step(&actions).unwrap();
        let b = rs.step(&actions).unwrap();
        assert_eq!(a, b, "turn {turn}");
        let mut next = Vec::new();
        for ((i, text), f) in actions.iter().zip(&b) {
            if f.done {
                solved += usize::from(f.reward == 1.0);
                continue;
            }
            let g: i64 = text.trim().parse().unwrap_or(-1);
            if (0..=31).contains(&g) {
                let (lo, hi) = bounds[*i];
                bounds[*i] = if f.observation == "+," {
                    (g + 1, hi)
                } else {
                    (lo, g - 1)
                };
            }
            next.push(*i);
        }
        running = next;
    }
    assert!(running.is_empty(), "every episode ends within its turns");
    assert!(solved > 10, "bisection solves most episodes: {solved}");
}

/// Random actions over the tiny policy's vocabulary (signs, commas, dots, several numbers):
/// the example reads every guess as the built-in does.
#[test]
fn python_example_reads_any_action_like_the_builtin() {
    let spec = ExternalEnvSpec {
        command: vec![
            "python3".into(),
            example(),
            "--max".into(),
            "31".into(),
            "--turns".into(),
            "50".into(),
        ],
        timeout_s: 30.0,
    };
    let mut py = ExternalEnv::spawn(&spec).unwrap();
    let mut rs = GuessNumber::new(31, 50);
    let episodes: Vec<Episode> = (0..200)
        .map(|id| Episode {
            id,
            seed: id as u64 * 7919,
        })
        .collect();
    assert_eq!(py.reset(&episodes).unwrap(), rs.reset(&episodes).unwrap());
    let vocab: Vec<char> = ember_llm::chartok::CHARS.chars().collect();
    let mut rng = ember_engine::SplitMix64(3);
    let mut running: Vec<usize> = (0..episodes.len()).collect();
    for turn in 0..40 {
        let actions: Vec<(usize, String)> = running
            .iter()
            .map(|&i| {
                let n = 1 + rng.below(6) as usize;
                let text = (0..n)
                    .map(|_| vocab[rng.below(vocab.len() as u64) as usize])
                    .collect();
                (i, text)
            })
            .collect();
        let a = py.step(&actions).unwrap();
        let b = rs.step(&actions).unwrap();
        assert_eq!(a, b, "turn {turn}: {actions:?}");
        running = actions
            .iter()
            .zip(&b)
            .filter(|(_, f)| !f.done)
            .map(|((i, _), _)| *i)
            .collect();
        if running.is_empty() {
            break;
        }
    }
}

/// An environment's non-finite or null reward is an invalid turn (NaN), not a broken answer.
#[test]
fn env_rewards_may_be_nan() {
    let program = "import sys, json\nfor line in sys.stdin:\n    r = json.loads(line)\n    if r['op'] == 'reset':\n        print(json.dumps({'observations': ['1=' for _ in r['episodes']]}), flush=True)\n    else:\n        print('{\"feedback\": [{\"observation\": \"\", \"reward\": NaN, \"done\": true}, {\"reward\": null, \"done\": true}]}', flush=True)\n";
    let spec = ExternalEnvSpec {
        command: vec!["python3".into(), "-c".into(), program.into()],
        timeout_s: 10.0,
    };
    let mut env = ExternalEnv::spawn(&spec).unwrap();
    env.reset(&[Episode { id: 0, seed: 1 }, Episode { id: 1, seed: 2 }])
        .unwrap();
    let f = env.step(&[(0, "1".into()), (1, "2".into())]).unwrap();
    assert!(f[0].reward.is_nan() && f[1].reward.is_nan() && f[0].done);
}

/// A program that dies, answers the wrong count or is not JSON: errors that name it.
#[test]
fn failing_env_programs_are_named_errors() {
    let run = |program: &str| -> String {
        let spec = ExternalEnvSpec {
            command: vec!["python3".into(), "-c".into(), program.into()],
            timeout_s: 10.0,
        };
        let mut env = ExternalEnv::spawn(&spec).unwrap();
        let e: EnvError = env
            .reset(&[Episode { id: 0, seed: 1 }, Episode { id: 1, seed: 2 }])
            .unwrap_err();
        e.to_string()
    };
    let e = run("import sys; sys.stdin.readline(); sys.exit(3)");
    assert!(
        e.contains("exited") && e.contains("reset (2 episodes)"),
        "{e}"
    );
    let e =
        run("import sys; sys.stdin.readline(); print('{\"observations\": [\"a\"]}', flush=True)");
    assert!(
        e.contains("answered 1 `observations` to reset (2 episodes) of 2"),
        "{e}"
    );
    let e = run("import sys; sys.stdin.readline(); print('oops', flush=True)");
    assert!(e.contains("is not JSON"), "{e}");
    let spec = ExternalEnvSpec {
        command: vec!["/no/such/env".into()],
        timeout_s: 10.0,
    };
    assert!(ExternalEnv::spawn(&spec).is_err_and(|e| e.to_string().contains("cannot start")));
}
