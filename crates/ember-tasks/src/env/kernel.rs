//! The kernel gym as an environment (KernelGYM, Dr.Kernel §3): an episode is a task of
//! `ember-gym`'s suite; each turn the policy answers with a C kernel, the gym compiles, checks,
//! times and profiles it, and its feedback (the verdict, the speed-up, the share of time in the
//! kernel's own code) is the next observation. Every turn is rewarded (eq. 1, with the
//! profiling-based reward of eq. 8 when `reward.coverage` > 0), so TRLOO credits each turn with
//! its reward-to-go; with `[env.rejection]` a correct turn whose coverage is low leaves the
//! update (profiling-based rejection sampling, eq. 9). A turn's evaluations run on `workers`
//! threads, each kernel in processes of its own.

use super::{EnvError, Environment, Episode, Feedback};
use ember_engine::SplitMix64;
use ember_gym::{
    EvalConfig, Executor, Job, Local, RejectionConfig, Report, RewardConfig, Task, Verdict,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The recipe's `[env]` table for `kind = "kernel-gym"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelGymSpec {
    /// Task names (`ember gym list`); an episode's seed picks one. Empty: every level-1 task.
    #[serde(default)]
    pub tasks: Vec<String>,
    /// Evaluations run at once (each a compiler and a harness process).
    #[serde(default = "two")]
    pub workers: usize,
    /// Hidden shapes checked beside the prompt's.
    #[serde(default = "three")]
    pub hidden_shapes: usize,
    /// CPU seconds a candidate's harness run may take.
    #[serde(default = "twenty")]
    pub cpu_s: u64,
    /// The reward's weights (`coverage` > 0 is the profiling-based reward).
    #[serde(default)]
    pub reward: RewardConfig,
    /// Profiling-based rejection sampling of correct turns with low coverage (absent: off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<RejectionConfig>,
    /// `ember gym serve` addresses (`http://host:port`) to evaluate on instead of this machine;
    /// the worker threads are spread over them (`EMBER_GYM_API_KEY` is sent as the bearer key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remote: Vec<String>,
}

fn two() -> usize {
    2
}

fn three() -> usize {
    3
}

fn twenty() -> u64 {
    20
}

impl KernelGymSpec {
    /// The tasks, checked: known names, at least one.
    ///
    /// # Errors
    /// [`EnvError::Protocol`] naming an unknown task or a bad setting.
    pub fn resolve(&self) -> Result<Vec<&'static Task>, EnvError> {
        let w = &self.reward;
        let weights = [w.correct, w.speedup, w.speedup_cap, w.coverage];
        if weights
            .iter()
            .any(|x| !x.is_finite() || *x < 0.0 || *x > 1e3)
        {
            return Err(EnvError::Protocol(format!(
                "env.reward: the weights and the cap must be within 0..=1000, got {weights:?}"
            )));
        }
        if let Some(r) = &self.rejection
            && !((0.0..=1.0).contains(&r.threshold) && (0.0..=1.0).contains(&r.band))
        {
            return Err(EnvError::Protocol(format!(
                "env.rejection: threshold and band must be within 0..=1, got {} and {}",
                r.threshold, r.band
            )));
        }
        if !(1..=64).contains(&self.workers)
            || self.hidden_shapes > 16
            || !(1..=600).contains(&self.cpu_s)
        {
            return Err(EnvError::Protocol(
                "env.workers must be in 1..=64, env.hidden_shapes at most 16, env.cpu_s in 1..=600"
                    .into(),
            ));
        }
        if self.tasks.is_empty() {
            return Ok(ember_gym::suite().iter().filter(|t| t.level == 1).collect());
        }
        let tasks = self
            .tasks
            .iter()
            .map(|n| {
                ember_gym::task(n)
                    .ok_or_else(|| EnvError::Gym(ember_gym::GymError::UnknownTask(n.clone())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(tasks)
    }
}

/// An episode in flight.
#[derive(Debug, Clone)]
struct Running {
    task: &'static Task,
    seed: u64,
    turn: usize,
}

/// The kernel gym.
pub struct KernelGym {
    spec: KernelGymSpec,
    tasks: Vec<&'static Task>,
    executor: Box<dyn Executor>,
    max_turns: usize,
    running: BTreeMap<usize, Running>,
}

impl KernelGym {
    /// The gym of `spec` with episodes of at most `max_turns` turns, evaluating on this machine.
    ///
    /// # Errors
    /// [`EnvError`] for an unknown task or a bad setting.
    pub fn new(spec: &KernelGymSpec, max_turns: usize) -> Result<Self, EnvError> {
        let tasks = spec.resolve()?;
        let cfg = Self::eval_config(spec);
        Ok(Self {
            spec: spec.clone(),
            tasks,
            executor: Box::new(Local(cfg)),
            max_turns: max_turns.max(1),
            running: BTreeMap::new(),
        })
    }

    /// The same gym evaluating through `executor` (another machine's gym, a GPU).
    pub fn with_executor(self, executor: Box<dyn Executor>) -> Self {
        Self { executor, ..self }
    }

    /// The local evaluation settings of `spec` (hidden shapes, CPU limit).
    pub fn eval_config(spec: &KernelGymSpec) -> EvalConfig {
        let mut cfg = EvalConfig {
            hidden_shapes: spec.hidden_shapes,
            ..EvalConfig::default()
        };
        cfg.run.cpu_s = spec.cpu_s;
        cfg.run.wall_s = 2.0 * spec.cpu_s as f64 + 5.0;
        cfg
    }

    /// The task of episode `seed`.
    pub fn task_of(&self, seed: u64) -> &'static Task {
        let n = self.tasks.len() as u64;
        self.tasks[(SplitMix64(seed ^ 0x6a11_7a5c).next_u64() % n) as usize]
    }

    /// A turn's feedback from its report.
    fn feedback(&self, r: &Report, run: &Running) -> Feedback {
        let reward = self.spec.reward.reward(r);
        let mut draw = SplitMix64::at(run.seed ^ 0x9e75_0000, run.turn as u64);
        let keep = self
            .spec
            .rejection
            .is_none_or(|prs| prs.keep(r, f64::from(draw.next_f32())));
        let v = &r.verdict;
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        let mut info = BTreeMap::from([
            ("compiled".to_string(), flag(v.compiled())),
            ("correct".to_string(), flag(v.correct())),
            ("hacking".to_string(), flag(v.hacking())),
        ]);
        if v.correct() {
            info.insert("speedup".into(), r.speedup.unwrap_or(0.0));
            info.insert("coverage".into(), r.coverage.unwrap_or(1.0));
            info.insert("rejected".into(), flag(!keep));
        }
        let done = run.turn + 1 >= self.max_turns;
        Feedback {
            observation: if done {
                String::new()
            } else {
                ember_gym::feedback(r)
            },
            reward: reward as f32,
            done,
            keep,
            info,
        }
    }
}

impl Environment for KernelGym {
    fn reset(&mut self, episodes: &[Episode]) -> Result<Vec<String>, EnvError> {
        let mut out = Vec::with_capacity(episodes.len());
        for e in episodes {
            let task = self.task_of(e.seed);
            self.running.insert(
                e.id,
                Running {
                    task,
                    seed: e.seed,
                    turn: 0,
                },
            );
            out.push(ember_gym::task_prompt(task));
        }
        Ok(out)
    }

    fn step(&mut self, actions: &[(usize, String)]) -> Result<Vec<Feedback>, EnvError> {
        let mut runs = Vec::with_capacity(actions.len());
        for (id, _) in actions {
            let run = self.running.get(id).cloned().ok_or_else(|| {
                EnvError::Protocol(format!(
                    "kernel gym: step for episode {id}, which is not running"
                ))
            })?;
            runs.push(run);
        }
        let codes: Vec<Option<String>> = actions
            .iter()
            .zip(&runs)
            .map(|((_, text), run)| ember_gym::extract_code(text, run.task.entry))
            .collect();
        let jobs: Vec<Job> = codes
            .iter()
            .zip(&runs)
            .filter_map(|(code, run)| {
                code.as_ref().map(|c| Job {
                    task: run.task,
                    code: c.clone(),
                    seed: SplitMix64::at(run.seed, run.turn as u64).next_u64(),
                })
            })
            .collect();
        let mut reports =
            ember_gym::evaluate_all(&jobs, self.executor.as_ref(), self.spec.workers).into_iter();
        let mut out = Vec::with_capacity(actions.len());
        for ((id, _), (code, run)) in actions.iter().zip(codes.iter().zip(&runs)) {
            let report = match code {
                Some(_) => reports.next().ok_or_else(|| {
                    EnvError::Protocol("kernel gym: a report is missing".into())
                })??,
                None => ember_gym::Report::unevaluated(run.task, Verdict::NoCode),
            };
            let fb = self.feedback(&report, run);
            if fb.done {
                self.running.remove(id);
            } else if let Some(r) = self.running.get_mut(id) {
                r.turn += 1;
            }
            out.push(fb);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADD: &str = "Here is a faster version:\n```c\nvoid vec_add(const float *a, const float *b, float *out, int n) {\n    for (int i = 0; i < n; i++) out[i] = a[i] + b[i];\n}\n```";

    #[test]
    fn episodes_take_turns_with_feedback_and_rewards() {
        let spec: KernelGymSpec = serde_json::from_str(
            r#"{"tasks": ["vec_add"], "reward": {"coverage": 1.0}, "rejection": {}}"#,
        )
        .unwrap();
        let mut gym = KernelGym::new(&spec, 2).unwrap();
        let obs = gym
            .reset(&[Episode { id: 0, seed: 1 }, Episode { id: 1, seed: 2 }])
            .unwrap();
        assert!(obs[0].contains("void vec_add(const float *a, const float *b, float *out, int n)"));
        let fb = gym
            .step(&[(0, ADD.into()), (1, "I cannot write C.".into())])
            .unwrap();
        assert!(
            fb[0].reward >= 2.0,
            "C + C·speed-up + C·PR: {}",
            fb[0].reward
        );
        assert!(fb[0].keep && !fb[0].done);
        assert_eq!(fb[0].info["correct"], 1.0);
        assert_eq!(fb[0].info["coverage"], 1.0);
        assert!(
            fb[0]
                .observation
                .starts_with("Result: correct. Speed-up over the reference: ")
        );
        assert_eq!(fb[1].reward, 0.0);
        assert_eq!(fb[1].info["compiled"], 0.0);
        assert!(fb[1].observation.contains("no C code found"));
        let fb = gym.step(&[(0, ADD.into()), (1, ADD.into())]).unwrap();
        assert!(fb.iter().all(|f| f.done && f.observation.is_empty()));
        assert!(gym.step(&[(0, ADD.into())]).is_err(), "episode 0 is over");
    }

    #[test]
    fn unknown_tasks_and_bad_settings_are_named() {
        let mut spec: KernelGymSpec = serde_json::from_str(r#"{"tasks": ["nope"]}"#).unwrap();
        let err = KernelGym::new(&spec, 1).err().unwrap().to_string();
        assert!(err.contains("\"nope\""), "{err}");
        spec.tasks = vec!["relu".into()];
        spec.workers = 0;
        assert!(KernelGym::new(&spec, 1).is_err());
        let all: KernelGymSpec = serde_json::from_str("{}").unwrap();
        let gym = KernelGym::new(&all, 1).unwrap();
        assert!(gym.tasks.iter().all(|t| t.level == 1) && gym.tasks.len() >= 4);
    }
}
