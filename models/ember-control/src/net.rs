//! The control networks: an MLP with tanh activations, the Gaussian policy and the value
//! network, initialised as PPO's implementations do (cleanrl `ppo_continuous_action`
//! `layer_init`: orthogonal weights with gain √2 on hidden layers, 0.01 on the policy's mean
//! head and 1 on the value head, zero biases; the log-std starts at 0).

use crate::error::check;
use crate::gaussian::{gaussian_entropy, gaussian_log_prob};
use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear};
use burn::tensor::{Device, Tensor};

/// An MLP's sizes and its output layer's initial gain.
#[derive(Config, Debug)]
pub struct MlpConfig {
    /// Input width.
    pub input: usize,
    /// Hidden widths (tanh after each).
    pub hidden: Vec<usize>,
    /// Output width.
    pub output: usize,
    /// Orthogonal gain of the output layer.
    #[config(default = 1.0)]
    pub out_gain: f64,
}

/// Linear layers with tanh between them (none after the last).
#[derive(Module, Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
}

fn orthogonal(input: usize, output: usize, gain: f64, device: &Device) -> Linear {
    Linear {
        weight: Initializer::Orthogonal { gain }.init([input, output], device),
        bias: Some(Initializer::Zeros.init([output], device)),
    }
}

impl MlpConfig {
    /// Checks the sizes.
    ///
    /// # Errors
    /// A zero width.
    pub fn validate(&self) -> crate::Result<()> {
        check("mlp.input", self.input, self.input > 0, "must be ≥ 1")?;
        check("mlp.output", self.output, self.output > 0, "must be ≥ 1")?;
        let ok = self.hidden.iter().all(|&h| h > 0) && self.hidden.len() <= 16;
        check(
            "mlp.hidden",
            format!("{:?}", self.hidden),
            ok,
            "1 to 16 widths, each ≥ 1",
        )
    }

    /// The MLP on `device` (draws from its RNG).
    pub fn init(&self, device: &Device) -> Mlp {
        let mut sizes = vec![self.input];
        sizes.extend(&self.hidden);
        let last = sizes.len() - 1;
        let mut layers: Vec<Linear> = (0..last)
            .map(|i| orthogonal(sizes[i], sizes[i + 1], 2f64.sqrt(), device))
            .collect();
        layers.push(orthogonal(sizes[last], self.output, self.out_gain, device));
        // Drawn now, in a fixed order: a lazily drawn parameter is shared by the module's
        // clones until first use, so a clone made `no_grad` before that use would freeze the
        // original too.
        for l in &layers {
            let _ = l.weight.val();
            if let Some(b) = &l.bias {
                let _ = b.val();
            }
        }
        Mlp { layers }
    }
}

impl Mlp {
    /// # Shapes
    /// `[n, input]` → `[n, output]`.
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        let last = self.layers.len() - 1;
        self.layers.iter().enumerate().fold(x, |h, (i, l)| {
            let y = l.forward(h);
            if i < last { y.tanh() } else { y }
        })
    }
}

/// The Gaussian policy's sizes.
#[derive(Config, Debug)]
pub struct GaussianPolicyConfig {
    /// Observation width.
    pub obs: usize,
    /// Action width.
    pub act: usize,
    /// Hidden widths of the mean's MLP.
    #[config(default = "vec![64, 64]")]
    pub hidden: Vec<usize>,
    /// The log-std's initial value (every action dimension).
    #[config(default = 0.0)]
    pub log_std_init: f32,
}

/// π(a|s) = N(μ_θ(s), diag exp(2·log_std)): the mean an MLP of the observation, the log-std
/// one learned vector (state-independent, as PPO's implementations have it). Actions are
/// sampled unbounded and the environment clips them to its range; the log-prob is that of the
/// unclipped sample (cleanrl, Stable-Baselines3's PPO), so no change-of-variables term enters.
#[derive(Module, Debug)]
pub struct GaussianPolicy {
    mean: Mlp,
    log_std: Param<Tensor<1>>,
}

impl GaussianPolicyConfig {
    /// The policy on `device` (draws from its RNG).
    ///
    /// # Errors
    /// A zero width or a log-std outside ±10.
    pub fn init(&self, device: &Device) -> crate::Result<GaussianPolicy> {
        let mlp = MlpConfig::new(self.obs, self.hidden.clone(), self.act).with_out_gain(0.01);
        mlp.validate()?;
        let v = self.log_std_init;
        check(
            "policy.log_std_init",
            v,
            v.is_finite() && v.abs() <= 10.0,
            "must be within ±10",
        )?;
        let log_std = Tensor::<1>::full([self.act], v, device);
        Ok(GaussianPolicy {
            mean: mlp.init(device),
            log_std: Param::from_tensor(log_std),
        })
    }
}

impl GaussianPolicy {
    /// μ_θ(s). # Shapes `[n, obs]` → `[n, act]`.
    pub fn mean(&self, obs: Tensor<2>) -> Tensor<2> {
        self.mean.forward(obs)
    }

    /// The log-std `[act]`.
    pub fn log_std(&self) -> Tensor<1> {
        self.log_std.val()
    }

    /// The policy with its log-std frozen (no gradient reaches it): a fixed exploration noise.
    pub fn with_fixed_std(self) -> Self {
        Self {
            log_std: self.log_std.set_require_grad(false),
            ..self
        }
    }

    /// The action width.
    pub fn act_dim(&self) -> usize {
        self.log_std.val().dims()[0]
    }

    /// log π(a|s) of `actions`. # Shapes `obs` `[n, obs]`, `actions` `[n, act]` → `[n]`.
    pub fn log_prob(&self, obs: Tensor<2>, actions: Tensor<2>) -> Tensor<1> {
        gaussian_log_prob(actions, self.mean(obs), self.log_std())
    }

    /// The entropy (the same in every state). # Shapes → `[1]`.
    pub fn entropy(&self) -> Tensor<1> {
        gaussian_entropy(self.log_std())
    }
}

/// The value network's sizes.
#[derive(Config, Debug)]
pub struct ValueNetConfig {
    /// Observation width.
    pub obs: usize,
    /// Hidden widths.
    #[config(default = "vec![64, 64]")]
    pub hidden: Vec<usize>,
}

/// V_φ(s): an MLP to one output.
#[derive(Module, Debug)]
pub struct ValueNet {
    mlp: Mlp,
}

impl ValueNetConfig {
    /// The critic on `device` (draws from its RNG).
    ///
    /// # Errors
    /// A zero width.
    pub fn init(&self, device: &Device) -> crate::Result<ValueNet> {
        let mlp = MlpConfig::new(self.obs, self.hidden.clone(), 1);
        mlp.validate()?;
        Ok(ValueNet {
            mlp: mlp.init(device),
        })
    }
}

impl ValueNet {
    /// V(s). # Shapes `[n, obs]` → `[n]`.
    pub fn value(&self, obs: Tensor<2>) -> Tensor<1> {
        let [n, _] = obs.dims();
        self.mlp.forward(obs).reshape([n])
    }
}
