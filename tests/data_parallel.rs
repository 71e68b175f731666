//! Data-parallel updates (`ember_train::DataParallel`): the update over N replicas equals the
//! update on one device — the same weights after several epochs × mini-batches × micro-batches,
//! the same gradient norm and loss — because every shard's loss is divided by the whole
//! mini-batch's normaliser and the shards' gradients are summed. On the CPU the replicas share
//! the one device (`gather`); the CUDA test (`--features cuda`) runs burn's NCCL `all_reduce`
//! over every CUDA device present.

use burn::module::{Module, Param};
use burn::tensor::activation::log_sigmoid;
use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_engine::{
    ActorLossConfig, AdvantageConfig, AdvantageKind, Advantages, LossAgg, RolloutBatch,
    compute_advantages,
};
use ember_train::{
    Actor, DataParallel, OptimizerConfig, ParallelError, Reduce, Scored, UpdateConfig,
    UpdateSchedule, UpdateStats, update,
};
use std::sync::Arc;

/// A policy over 5 steps whose log-probs are log σ(x·W + θ) for row features x `[rows, 3]`.
#[derive(Module, Debug)]
struct Toy {
    w: Param<Tensor<2>>,
    theta: Param<Tensor<1>>,
}

const STEPS: usize = 5;

/// The rows of each `Toy::score` call, made on any thread (the shards run on the CPU pool's
/// workers), with the batch's row count: the tests that read it use batches of [`BUDGET_ROWS`]
/// and [`SHARED_ROWS`] rows, which no other test uses.
static SCORED: std::sync::Mutex<Vec<(usize, Vec<usize>)>> = std::sync::Mutex::new(Vec::new());
const BUDGET_ROWS: usize = 11;
const SHARED_ROWS: usize = 14;

/// The recorded calls on batches of `batch` rows, removed from the record.
fn take_scored(batch: usize) -> Vec<Vec<usize>> {
    let mut all = SCORED.lock().unwrap();
    let (mine, rest) = std::mem::take(&mut *all)
        .into_iter()
        .partition::<Vec<_>, _>(|(b, _)| *b == batch);
    *all = rest;
    mine.into_iter().map(|(_, rows)| rows).collect()
}

impl Actor for Toy {
    type Experience = Tensor<2>;

    fn score(&self, x: &Tensor<2>, rows: &[usize], _: bool) -> Scored {
        let batch = x.dims()[0];
        if [BUDGET_ROWS, SHARED_ROWS].contains(&batch)
            && let Ok(mut s) = SCORED.lock()
        {
            s.push((batch, rows.to_vec()));
        }
        let idx: Vec<i64> = rows.iter().map(|r| *r as i64).collect();
        let idx = Tensor::<1, Int>::from_data(TensorData::new(idx, [rows.len()]), &x.device());
        let x = x.clone().select(0, idx);
        let logits = x.matmul(self.w.val()) + self.theta.val().reshape([1, STEPS]);
        Scored {
            recompute: None,
            log_probs: log_sigmoid(logits),
            entropy: None,
            kl: None,
        }
    }
}

fn values(t: Tensor<2>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

struct Case {
    toy: Toy,
    x: Tensor<2>,
    batch: RolloutBatch,
    adv: Advantages,
}

/// `rows` rows in groups of 4 with deterministic features, lengths 1..=5 and rewards.
fn case(d: &Device, rows: usize) -> Case {
    let w: Vec<f32> = (0..3 * STEPS)
        .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
        .collect();
    let toy = Toy {
        w: Param::from_tensor(Tensor::from_data(TensorData::new(w, [3, STEPS]), d)),
        theta: Param::from_tensor(Tensor::from_floats([0.3, -0.2, 0.5, 0.1, 0.0], d)),
    };
    let xs: Vec<f32> = (0..rows * 3)
        .map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.15)
        .collect();
    let x = Tensor::from_data(TensorData::new(xs, [rows, 3]), d);
    let mask: Vec<f32> = (0..rows)
        .flat_map(|r| (0..STEPS).map(move |t| f32::from(u8::from(t <= r % STEPS))))
        .collect();
    let mask = Tensor::from_data(TensorData::new(mask, [rows, STEPS]), d);
    let rewards: Vec<f32> = (0..rows).map(|r| ((r * 3) % 4) as f32 / 3.0).collect();
    let groups: Vec<usize> = (0..rows).map(|r| r / 4).collect();
    let lp = toy.score(&x, &(0..rows).collect::<Vec<_>>(), false);
    let batch = RolloutBatch::new(mask, Tensor::from_floats(rewards.as_slice(), d), &groups)
        .unwrap()
        .with_old_log_probs(lp.log_probs.detach())
        .unwrap();
    let adv = compute_advantages(&AdvantageConfig::new(AdvantageKind::Rloo), &batch, 0).unwrap();
    Case { toy, x, batch, adv }
}

fn run(c: &Case, group: Option<Arc<DataParallel>>, cfg: &UpdateConfig) -> (Toy, UpdateStats) {
    let mut optim = OptimizerConfig::default().with_grad_clip(1.0).init();
    if let Some(g) = group {
        optim = optim.with_data_parallel(g);
    }
    // A fixed permutation per epoch, so that shards cut across groups.
    let mut epoch = 0;
    let mut order = |n: usize| {
        epoch += 1;
        (0..n).map(|i| (i * 5 + epoch) % n).collect()
    };
    update(
        c.toy.clone(),
        &mut optim,
        ember_train::UpdateData {
            experience: &c.x,
            batch: &c.batch,
            adv: &c.adv,
        },
        cfg,
        0.05,
        &mut order,
    )
    .unwrap()
}

fn max_diff(a: &Toy, b: &Toy) -> f32 {
    let (w, t) = (
        values(a.w.val() - b.w.val()),
        values((a.theta.val() - b.theta.val()).reshape([1, STEPS])),
    );
    w.iter().chain(&t).fold(0.0, |m, v| m.max(v.abs()))
}

fn schedule(epochs: usize, mini_batches: usize, micro_batch_rows: usize) -> UpdateConfig {
    UpdateConfig {
        schedule: UpdateSchedule {
            epochs,
            mini_batches,
            micro_batch_rows,
            micro_batch_tokens: 0,
            lopti_threshold: None,
        },
        loss: ActorLossConfig::default(),
    }
}

fn cpu_group(d: &Device, n: usize) -> Arc<DataParallel> {
    Arc::new(DataParallel::new(vec![d.clone(); n], Reduce::Gather).unwrap())
}

/// Two and three replicas, with and without micro-batches, several mini-batches and epochs,
/// token-mean and sequence-mean aggregation: the weights equal one device's to float rounding
/// (the sum of the shards' gradients is the whole mini-batch's), and they moved.
#[test]
fn replicas_update_as_one_device() {
    let d = Device::default().autodiff();
    for (rows, cfg) in [
        (8, schedule(1, 1, 0)),
        (12, schedule(2, 2, 0)),
        (12, schedule(2, 2, 2)),
        (9, schedule(1, 1, 4)),
    ] {
        for agg in [LossAgg::TokenMean, LossAgg::SeqMeanTokenMean] {
            let mut cfg = cfg;
            cfg.loss.agg = agg;
            let c = case(&d, rows);
            let (one, s1) = run(&c, None, &cfg);
            assert!(max_diff(&one, &c.toy) > 1e-3, "the update moved nothing");
            for n in [2, 3] {
                let (dp, sn) = run(&c, Some(cpu_group(&d, n)), &cfg);
                let diff = max_diff(&one, &dp);
                assert!(diff < 2e-6, "{rows} rows, {n} replicas, {cfg:?}: {diff}");
                assert_eq!(s1.optimizer_steps, sn.optimizer_steps);
                for key in ["actor/grad_norm", "actor/pg_loss", "actor/loss"] {
                    let (a, b) = (s1.metrics[key], sn.metrics[key]);
                    assert!(
                        (a - b).abs() <= 1e-5 * a.abs().max(1e-3),
                        "{key}: one device {a}, {n} replicas {b}"
                    );
                }
            }
        }
    }
}

/// More replicas than rows: the empty shards contribute nothing and the update is unchanged.
#[test]
fn empty_shards_add_nothing() {
    let d = Device::default().autodiff();
    let c = case(&d, 2);
    let cfg = schedule(1, 1, 0);
    let (one, _) = run(&c, None, &cfg);
    let (dp, stats) = run(&c, Some(cpu_group(&d, 4)), &cfg);
    assert!(max_diff(&one, &dp) < 2e-6);
    assert_eq!(stats.optimizer_steps, 1);
}

/// Micro-batches' loss values are parts of the mini-batch's loss: they add up, so the logged
/// loss does not depend on how the mini-batch is cut (it used to be averaged).
#[test]
fn logged_loss_does_not_depend_on_micro_batches() {
    let d = Device::default().autodiff();
    let c = case(&d, 8);
    let (_, whole) = run(&c, None, &schedule(1, 1, 0));
    let (_, micro) = run(&c, None, &schedule(1, 1, 2));
    let (a, b) = (
        whole.metrics["actor/pg_loss"],
        micro.metrics["actor/pg_loss"],
    );
    assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    assert!(a.abs() > 1e-4);
}

/// A token budget cuts each mini-batch into micro-batches of rows sorted longest first, each
/// within rows × longest row ≤ budget (row r has r % 5 + 1 valid steps here), and the update
/// equals the uncut one: on one device and over two replicas.
#[test]
fn token_budget_micro_batches_update_as_the_whole_batch() {
    let d = Device::default().autodiff();
    for mini_batches in [1, 2] {
        let c = case(&d, BUDGET_ROWS);
        let (whole, s0) = run(&c, None, &schedule(2, mini_batches, 0));
        let mut cfg = schedule(2, mini_batches, 0);
        cfg.schedule.micro_batch_tokens = 6;
        take_scored(BUDGET_ROWS);
        let (cut, s1) = run(&c, None, &cfg);
        let calls = take_scored(BUDGET_ROWS);
        let len = |r: &usize| r % STEPS + 1;
        assert!(calls.len() > 2 * mini_batches, "{calls:?}");
        for rows in &calls {
            let longest = rows.iter().map(len).max().unwrap_or(0);
            assert!(rows.len() == 1 || rows.len() * longest <= 6, "{rows:?}");
            let lens: Vec<usize> = rows.iter().map(len).collect();
            assert!(
                lens.windows(2).all(|w| w[0] >= w[1]),
                "not sorted: {rows:?}"
            );
        }
        assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 2 * BUDGET_ROWS);
        let diff = max_diff(&whole, &cut);
        assert!(diff < 2e-6, "{mini_batches} mini-batches: {diff}");
        assert!(max_diff(&whole, &c.toy) > 1e-3);
        let (a, b) = (s0.metrics["actor/loss"], s1.metrics["actor/loss"]);
        assert!((a - b).abs() <= 1e-5 * a.abs().max(1e-3), "{a} vs {b}");
        let (dp, _) = run(&c, Some(cpu_group(&d, 2)), &cfg);
        assert!(max_diff(&whole, &dp) < 2e-6);
    }
}

/// Replicas sharing one device share its micro-batch bounds: two CPU replicas of a 4-row bound
/// pass 2 rows at a time (what the device holds at once is unchanged), and the update still
/// equals one device's.
#[test]
fn replicas_on_one_device_share_its_micro_batch_bounds() {
    let d = Device::default().autodiff();
    assert_eq!(cpu_group(&d, 2).on_first_device(), 2);
    let c = case(&d, SHARED_ROWS);
    let cfg = schedule(1, 1, 4);
    let (one, _) = run(&c, None, &cfg);
    take_scored(SHARED_ROWS);
    let (dp, _) = run(&c, Some(cpu_group(&d, 2)), &cfg);
    let calls = take_scored(SHARED_ROWS);
    assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), SHARED_ROWS);
    assert!(calls.iter().all(|r| r.len() <= 2), "{calls:?}");
    assert_eq!(
        calls.len(),
        8,
        "two shards of 7 rows, 2 rows a pass: {calls:?}"
    );
    assert!(max_diff(&one, &dp) < 2e-6);
}

#[test]
fn bad_groups_are_named() {
    let d = Device::default().autodiff();
    assert_eq!(
        DataParallel::new(vec![], Reduce::Gather).unwrap_err(),
        ParallelError::NoDevices
    );
    let e = DataParallel::new(vec![d.clone(), d], Reduce::AllReduce).unwrap_err();
    assert_eq!(e, ParallelError::RepeatedDevice { index: 1 });
    assert!(e.to_string().contains("use `gather`"), "{e}");
}

/// burn's NCCL `all_reduce` over every CUDA device present (one device: a group of one, which
/// still runs the collective path) equals one device's update. Runs only in a CUDA build.
#[cfg(feature = "cuda")]
#[test]
fn all_reduce_on_cuda_equals_one_device() {
    let devices: Vec<Device> = Device::enumerate(burn::tensor::DeviceType::Cuda)
        .into_vec()
        .into_iter()
        .map(Device::autodiff)
        .collect();
    if devices.is_empty() {
        eprintln!("no CUDA device: skipped");
        return;
    }
    let d = devices[0].clone();
    let group = Arc::new(DataParallel::new(devices.clone(), Reduce::AllReduce).unwrap());
    assert_eq!(group.reduce(), Reduce::AllReduce);
    for cfg in [schedule(1, 1, 0), schedule(2, 2, 2)] {
        let c = case(&d, 12);
        let (one, _) = run(&c, None, &cfg);
        let (dp, _) = run(&c, Some(group.clone()), &cfg);
        let diff = max_diff(&one, &dp);
        eprintln!(
            "{} CUDA device(s), {cfg:?}: max |Δw| = {diff:e}",
            devices.len()
        );
        assert!(diff < 1e-5, "{diff}");
    }
}

fn train(out: &std::path::Path, sets: &[&str]) -> std::process::Output {
    let recipe =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("recipes/arithmetic-cpu.toml");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ember"));
    cmd.args([
        "train",
        recipe.to_str().unwrap(),
        "--quiet",
        "--overwrite",
        "--out",
    ])
    .arg(out);
    for s in [
        "warmup.steps=60",
        "train.steps=2",
        "train.eval_every=1000",
        "task.eval_size=20",
    ]
    .iter()
    .chain(sets)
    {
        cmd.args(["--set", s]);
    }
    cmd.output().unwrap()
}

fn step_one(out: &std::path::Path) -> serde_json::Value {
    let lines = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|v| v["step"].as_f64() == Some(1.0))
        .unwrap()
}

/// The main job with `data_parallel.cpu_shards = 2` (two replicas on the CPU, as `devices = 2`
/// there): its first update's gradient norm and losses equal the single-device run's; bad
/// settings are named before the warm-up.
#[test]
fn main_job_with_two_replicas() {
    let base = std::env::temp_dir().join(format!("ember-dp-{}", std::process::id()));
    let (one, two) = (base.join("one"), base.join("two"));
    assert!(train(&one, &[]).status.success());
    let o = train(&two, &["data_parallel.cpu_shards=2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (a, b) = (step_one(&one), step_one(&two));
    for key in ["actor/grad_norm", "actor/pg_loss", "rollout/reward_mean"] {
        let (x, y) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert!(
            (x - y).abs() <= 1e-4 * x.abs().max(1e-2),
            "{key}: {x} vs {y}"
        );
    }
    let resolved = std::fs::read_to_string(two.join("recipe.resolved.toml")).unwrap();
    assert!(resolved.contains("[data_parallel]"), "{resolved}");
    for (set, says) in [
        (
            "data_parallel.devices=0",
            "data_parallel.devices must be at least 1",
        ),
        ("data_parallel.reduce=\"all_reduce\"", "CUDA only (NCCL)"),
        ("data_parallel.reduce=\"ring\"", "ring"),
        ("data_parallel.cpu_shards=2", "set one of them"),
    ] {
        let bad = base.join("bad");
        let o = train(&bad, &["data_parallel.devices=2", set]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{set}: {err}");
        // Refused before the warm-up's evaluation logged anything.
        let logged = std::fs::read_to_string(bad.join("metrics.jsonl")).unwrap_or_default();
        assert!(!logged.contains("eval/accuracy"), "{set}: refused late");
    }
    std::fs::remove_dir_all(&base).ok();
}

/// `[data_parallel]` where it cannot apply is refused when the recipe is read.
#[test]
fn recipes_refuse_data_parallel_where_it_cannot_apply() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let offline = std::fs::read_to_string(root.join("recipes/arithmetic-offline.toml")).unwrap();
    let e =
        ember::llm::schema::parse(&offline, &["data_parallel.devices=2".to_string()]).unwrap_err();
    assert!(format!("{e:#}").contains("offline objectives"), "{e:#}");
    let main = std::fs::read_to_string(root.join("recipes/arithmetic-cpu.toml")).unwrap();
    let e = ember::llm::schema::parse(&main, &["data_parallel.devices=0".to_string()]).unwrap_err();
    assert!(format!("{e:#}").contains("at least 1"), "{e:#}");
    assert!(ember::llm::schema::parse(&main, &["data_parallel.devices=2".to_string()]).is_ok());
    let e =
        ember::llm::schema::parse(&main, &["data_parallel.cpu_shards=0".to_string()]).unwrap_err();
    assert!(format!("{e:#}").contains("cpu_shards = 0"), "{e:#}");
    assert!(ember::llm::schema::parse(&main, &["data_parallel.cpu_shards=2".to_string()]).is_ok());
}
