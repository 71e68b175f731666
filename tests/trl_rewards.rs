//! Reward functions as TRL users write them, through Ember's Python adapter: the arguments TRL's
//! `GRPOTrainer` passes (conversational prompts and completions as message dicts, columns under
//! their own names, `completion_ids`, `trainer_state`, `log_metric`, async functions), and TRL's
//! own `trl.rewards` functions from the PyPI package, unmodified.

mod common;

use ember_tasks::reward::{ExternalReward, PythonSpec, RewardItem, TrainerState};
use std::path::PathBuf;

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ember-trl-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Functions that check the shapes TRL gives them and encode what they saw in their values.
const MODULE: &str = r#"
import asyncio

def shapes(prompts, completions, solution, completion_ids, trainer_state, log_metric, **kwargs):
    log_metric("seen", len(completions))
    out = []
    for p, c, s, ids in zip(prompts, completions, solution, completion_ids):
        if isinstance(p, list):
            assert p[-1] == {"role": "user", "content": "What is 2 + 3?"}, p
            assert isinstance(c, list) and c[0]["role"] == "assistant", c
            text = c[0]["content"]
        else:
            assert isinstance(p, str) and isinstance(c, str), (p, c)
            text = c
        out.append(float(text == str(s)) + 10 * len(ids) + 100 * trainer_state.global_step
                   + 1000 * trainer_state.max_steps)
    return out

async def judged(completions, **kwargs):
    await asyncio.sleep(0.01)
    return [0.5 for _ in completions]

def progress(completions, trainer_state, **kwargs):
    return [trainer_state.epoch for _ in completions]
"#;

#[test]
fn trl_shaped_arguments_reach_reward_functions() {
    let d = tmp("shapes");
    let m = d.join("rewards.py");
    std::fs::write(&m, MODULE).unwrap();
    let m = m.display();
    let spec = PythonSpec {
        functions: vec![
            format!("{m}:shapes"),
            format!("{m}:judged"),
            format!("{m}:progress"),
        ],
        python: "python3".into(),
        timeout_s: 30.0,
    };
    let mut program = ExternalReward::spawn_python(&spec).unwrap();
    let col = |v: i64| {
        serde_json::json!({ "solution": v })
            .as_object()
            .unwrap()
            .clone()
    };
    let (c5, c8) = (col(5), col(8));
    let chat = [
        ("system".to_string(), "Be brief.".to_string()),
        ("user".to_string(), "What is 2 + 3?".to_string()),
    ];
    let items = [
        RewardItem {
            prompt: "What is 2 + 3?",
            completion: "5",
            answer: "5",
            group: 0,
            columns: &c5,
            messages: &chat,
            completion_ids: &[11, 12],
        },
        RewardItem {
            prompt: "4+4=",
            completion: "7",
            answer: "8",
            group: 1,
            columns: &c8,
            messages: &[],
            completion_ids: &[13],
        },
    ];
    let state = TrainerState {
        global_step: 2,
        max_steps: 10,
        epoch: 0.25,
    };
    let s = program.score_at(3, &items, Some(state)).unwrap();
    // shapes: match + 10·len(ids) + 100·global_step + 1000·max_steps; judged 0.5; progress 0.25.
    assert_eq!(s.rewards, vec![10_221.75, 10_210.75]);
    assert_eq!(s.metrics, vec![("seen".to_string(), 2.0)]);
    std::fs::remove_dir_all(&d).ok();
}

/// TRL's own reward functions (PyPI `trl`, in the environment `scripts/fetch_assets.sh` makes)
/// named as `module:function`, on a conversational batch with the answer column `solution`.
#[test]
fn trl_own_reward_functions_run_unmodified() {
    let Some(python) = common::assets::cached("py/bin/python") else {
        return;
    };
    let spec = PythonSpec {
        functions: vec![
            "trl.rewards:accuracy_reward".into(),
            "trl.rewards:think_format_reward=0.5".into(),
        ],
        python: python.to_string_lossy().into(),
        timeout_s: 120.0,
    };
    let mut program = ExternalReward::spawn_python(&spec).unwrap();
    let chat = [("user".to_string(), "How many eggs?".to_string())];
    let cases = [
        ("<think>9 + 9</think>So $\\boxed{18}$ eggs.", "18"),
        ("The answer is 17.", "18"),
        ("<think>hm</think>no idea", "no number here"),
    ];
    let cols: Vec<_> = cases
        .iter()
        .map(|(_, s)| {
            serde_json::json!({ "solution": s })
                .as_object()
                .unwrap()
                .clone()
        })
        .collect();
    let items: Vec<RewardItem> = cases
        .iter()
        .zip(&cols)
        .enumerate()
        .map(|(i, ((c, _), col))| RewardItem {
            prompt: "How many eggs?",
            completion: c,
            answer: "18",
            group: i,
            columns: col,
            messages: &chat,
            completion_ids: &[],
        })
        .collect();
    let s = program.score(1, &items).unwrap();
    // accuracy_reward: 1, 0, None (an unparseable solution); think_format_reward: 1, 0, 1.
    assert_eq!(s.rewards, vec![1.5, 0.0, 0.5]);
    let accuracy = &s.components[0].1;
    assert_eq!(s.components[0].0, "accuracy_reward");
    assert!(accuracy[0] == 1.0 && accuracy[1] == 0.0 && accuracy[2].is_nan());
}
