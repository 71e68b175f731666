//! Exponential moving average of a model's weights (Polyak averaging, as diffusion pretraining
//! uses for sampling: DDPM, Ho et al. 2020 §4; DiT §4 "EMA of weights with decay 0.9999").

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::Tensor;
use std::collections::HashMap;

struct Collect(HashMap<ParamId, Tensor<1>>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.val().detach();
        let n = t.shape().num_elements();
        self.0.insert(param.id, t.reshape([n]));
    }
}

struct Blend {
    src: HashMap<ParamId, Tensor<1>>,
    decay: f32,
}

impl ModuleMapper for Blend {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let Some(new) = self.src.remove(&param.id) else {
            return param;
        };
        let decay = self.decay;
        param.map(|t| {
            let shape = t.shape();
            (t * decay + new.reshape(shape) * (1.0 - decay)).detach()
        })
    }
}

/// θ_ema ← d·θ_ema + (1 − d)·θ for every parameter the two modules share (by `ParamId`; make
/// the average with `model.clone()` so the ids match). Runs on the device, no gradient.
pub fn ema_update<M: Module>(ema: M, model: &M, decay: f32) -> M {
    let mut c = Collect(HashMap::new());
    model.visit(&mut c);
    ema.map(&mut Blend { src: c.0, decay })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Device;

    #[test]
    fn blends_by_id() {
        let device = Device::flex();
        let a: Linear = LinearConfig::new(2, 2).init(&device);
        let ema = a.clone();
        let b = a.clone().map(&mut Blend {
            src: {
                let mut c = Collect(HashMap::new());
                a.visit(&mut c);
                c.0.into_iter().map(|(k, v)| (k, v.ones_like())).collect()
            },
            decay: 0.0,
        });
        // ema ← 0.75·ema + 0.25·b with b ≡ 1.
        let out = ema_update(ema, &b, 0.75);
        let w0 = a.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let w1 = out.weight.val().into_data().try_to_vec::<f32>().unwrap();
        for (x, y) in w0.iter().zip(&w1) {
            assert!((0.75 * x + 0.25 - y).abs() < 1e-6);
        }
    }
}
