//! The precision of a model's matrix products, shared by the models (the LLM and the flow DiT).

use burn::tensor::DType;
use serde::{Deserialize, Serialize};

/// The precision of the model's matrix products.
///
/// `Bf16` is automatic mixed precision in the manner of PyTorch's `torch.autocast`: parameters
/// (and so gradients and optimizer state) stay f32, each projection casts its weight and input
/// to bf16 for the product, and the numerically sensitive steps run in f32 (each model says
/// which: the LLM's RMSNorm, attention softmax and logits; the DiT's norms, softmax and
/// modulations).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 throughout (the default, and the only choice on the CPU and wgpu backends' f32
    /// kernels).
    #[default]
    F32,
    /// bf16 products with f32 parameters, normalisation, softmax and logits.
    Bf16,
}

impl Precision {
    /// The dtype of activations between projections.
    pub fn activation_dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::Bf16 => DType::BF16,
        }
    }
}
