//! Data-parallel updates on several devices of one process: each mini-batch is cut into one
//! shard of rows per device, every replica runs the forward and backward passes of its shard
//! (in its own thread) with the *mini-batch's* loss normalisers, the replicas' gradients are
//! summed, and one optimizer step is taken on the first device. Because every shard's loss is
//! already divided by the whole mini-batch's token count (or sequence count), the sum of the
//! shards' gradients is the gradient of the whole mini-batch: the update equals one device's
//! (verl's `dp_actor` with `loss_agg_mode` normalisers all-reduced over the data-parallel group;
//! PyTorch DDP with a summing reduction).
//!
//! Two reductions: [`Reduce::AllReduce`] uses burn's collective (`burn::tensor::distributed`,
//! NCCL on CUDA, the only backend burn 0.22 provides it on), [`Reduce::Gather`] copies each
//! replica's gradients to the first device and adds them there (any backend; on the CPU the
//! replicas share the one device and the point is checking the arithmetic, not speed).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::distributed::{
    CollectiveTensor, DistributedConfig, DistributedContext, ReduceOperation, all_reduce,
};
use burn::tensor::{Device, Int, Tensor};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Experience a data-parallel replica on another device can read: a copy of its tensors there.
pub trait Replicate: Sync + Sized {
    /// The same experience on `device`.
    #[must_use]
    fn to_device(&self, device: &Device) -> Self;
}

impl<const D: usize> Replicate for Tensor<D> {
    fn to_device(&self, device: &Device) -> Self {
        self.clone().to_device(device)
    }
}

impl<const D: usize> Replicate for Tensor<D, Int> {
    fn to_device(&self, device: &Device) -> Self {
        self.clone().to_device(device)
    }
}

/// How the replicas' gradients are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reduce {
    /// burn's `all_reduce` where the backend has a collective (CUDA), else `gather`.
    #[default]
    Auto,
    /// Copy every replica's gradients to the first device and add them there.
    Gather,
    /// burn's collective `all_reduce` (sum) over the devices (NCCL on CUDA).
    AllReduce,
}

impl fmt::Display for Reduce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Gather => "gather",
            Self::AllReduce => "all_reduce",
        })
    }
}

/// A data-parallel group that cannot be formed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParallelError {
    /// No device was given.
    #[error("data-parallel training needs at least one device")]
    NoDevices,
    /// `all_reduce` over a device listed twice (NCCL puts one rank per device).
    #[error(
        "`all_reduce` needs distinct devices (one NCCL rank each), but device {index} repeats an \
         earlier one; use `gather` to run several replicas on one device"
    )]
    RepeatedDevice {
        /// The repeated device's position.
        index: usize,
    },
}

/// The devices of a data-parallel update and how their gradients are summed. The first device
/// holds the model and the optimizer; the others hold a replica during each mini-batch.
pub struct DataParallel {
    devices: Vec<Device>,
    reduce: Reduce,
    /// Keeps burn's communication server alive while the group exists (`all_reduce` only).
    _context: Option<DistributedContext>,
}

impl fmt::Debug for DataParallel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataParallel")
            .field("devices", &self.devices.len())
            .field("reduce", &self.reduce)
            .finish()
    }
}

impl DataParallel {
    /// A group over `devices` (autodiff devices; the first is the model's). `reduce` must be
    /// resolved: `Auto` is taken as `Gather` here (the caller knows the backend).
    ///
    /// # Errors
    /// No device, or `AllReduce` over a repeated device.
    pub fn new(devices: Vec<Device>, reduce: Reduce) -> Result<Self, ParallelError> {
        if devices.is_empty() {
            return Err(ParallelError::NoDevices);
        }
        let reduce = match reduce {
            Reduce::Auto => Reduce::Gather,
            r => r,
        };
        let context = if reduce == Reduce::AllReduce {
            for (i, d) in devices.iter().enumerate() {
                if devices[..i].contains(d) {
                    return Err(ParallelError::RepeatedDevice { index: i });
                }
            }
            Some(DistributedContext::init(
                inner(&devices),
                DistributedConfig {
                    all_reduce_op: ReduceOperation::Sum,
                },
            ))
        } else {
            None
        };
        Ok(Self {
            devices,
            reduce,
            _context: context,
        })
    }

    /// The devices, the model's first.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// How many replicas run on the model's device (the first), itself included: more than one
    /// where replicas share a device, as CPU shards do.
    pub fn on_first_device(&self) -> usize {
        self.devices
            .iter()
            .filter(|d| **d == self.devices[0])
            .count()
    }

    /// The reduction in use (`Gather` or `AllReduce`).
    pub fn reduce(&self) -> Reduce {
        self.reduce
    }

    /// The replicas of `model` on the devices after the first, forked once per update (the
    /// frozen weights copied once); [`sync_trained`](Self::sync_trained) keeps them current.
    pub(crate) fn fork<M: Module>(&self, model: &M) -> Vec<M> {
        self.devices[1..]
            .iter()
            .map(|d| model.clone().fork(d))
            .collect()
    }

    /// After an optimizer step on `model`: its trained parameters (those with gradients) copied
    /// into each replica as fresh leaves; the frozen ones (a LoRA run's base) stay as forked.
    pub(crate) fn sync_trained<M: Module>(&self, model: &M, replicas: Vec<M>) -> Vec<M> {
        struct Collect(GradientsParams);
        impl ModuleVisitor for Collect {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if param.is_require_grad() {
                    self.0.register(param.id, param.val().detach());
                }
            }
        }
        struct Put<'a> {
            values: &'a GradientsParams,
            device: &'a Device,
        }
        impl ModuleMapper for Put<'_> {
            fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
                match self.values.get::<D>(param.id) {
                    Some(v) => param.map(|_| v.to_device(self.device).detach().require_grad()),
                    None => param,
                }
            }
        }
        let mut values = Collect(GradientsParams::new());
        model.visit(&mut values);
        replicas
            .into_iter()
            .zip(&self.devices[1..])
            .map(|(r, device)| {
                r.map(&mut Put {
                    values: &values.0,
                    device,
                })
            })
            .collect()
    }

    /// `rows` cut into one contiguous shard per device, sizes differing by at most one (the
    /// first shards take the remainder; a shard is empty when there are fewer rows than devices).
    pub fn shards<'a>(&self, rows: &'a [usize]) -> Vec<&'a [usize]> {
        let n = self.devices.len();
        (0..n)
            .map(|k| &rows[k * rows.len() / n..(k + 1) * rows.len() / n])
            .collect()
    }

    /// The sum of the replicas' gradients (`grads[k]` on device k; missing parameters count as
    /// zero), on the first device.
    pub(crate) fn sum<M: Module>(&self, model: &M, grads: Vec<GradientsParams>) -> GradientsParams {
        match self.reduce {
            Reduce::AllReduce => {
                let mut v = AllReduceVisitor {
                    grads,
                    devices: inner(&self.devices),
                    out: GradientsParams::new(),
                    seen: Vec::new(),
                };
                model.visit(&mut v);
                v.out
            }
            _ => {
                let mut acc = GradientsAccumulator::<M>::new();
                for (k, g) in grads.into_iter().enumerate() {
                    let g = if k == 0 {
                        g
                    } else {
                        g.to_device(&self.devices[0], model)
                    };
                    acc.accumulate(model, g);
                }
                acc.grads()
            }
        }
    }
}

/// The experience as each replica reads it: a copy on each device other than the model's (made
/// once per update), the original elsewhere and without a group.
pub(crate) struct Copies<'a, E> {
    original: &'a E,
    copies: Vec<Option<E>>,
}

impl<'a, E: Replicate> Copies<'a, E> {
    pub(crate) fn new(group: Option<&DataParallel>, original: &'a E) -> Self {
        let copies = group.map_or_else(Vec::new, |dp| {
            dp.devices
                .iter()
                .map(|d| (*d != dp.devices[0]).then(|| original.to_device(d)))
                .collect()
        });
        Self { original, copies }
    }

    /// What replica `k` reads.
    pub(crate) fn get(&self, k: usize) -> &E {
        self.copies
            .get(k)
            .and_then(Option::as_ref)
            .unwrap_or(self.original)
    }
}

fn inner(devices: &[Device]) -> Vec<Device> {
    devices.iter().map(|d| d.clone().inner()).collect()
}

/// Every parameter's gradients all-reduced (sum) across the replicas, in the model's parameter
/// order on every device (the order a collective needs); a replica without a gradient for a
/// parameter (its shard was empty, or did not reach it) contributes zeros.
struct AllReduceVisitor {
    grads: Vec<GradientsParams>,
    devices: Vec<Device>,
    out: GradientsParams,
    seen: Vec<ParamId>,
}

impl ModuleVisitor for AllReduceVisitor {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if self.seen.contains(&param.id) {
            return;
        }
        self.seen.push(param.id);
        let parts: Vec<Option<Tensor<D>>> = self
            .grads
            .iter_mut()
            .map(|g| g.remove::<D>(param.id))
            .collect();
        let Some(shape) = parts.iter().flatten().next().map(Tensor::shape) else {
            return; // no replica has a gradient: not a trained parameter
        };
        let collectives: Vec<CollectiveTensor<D>> = parts
            .into_iter()
            .zip(&self.devices)
            .map(|(g, d)| {
                let g = g.unwrap_or_else(|| Tensor::zeros(shape.clone(), d));
                all_reduce(g, ReduceOperation::Sum, self.devices.clone())
            })
            .collect();
        let mut reduced = collectives.into_iter().map(CollectiveTensor::resolve);
        if let Some(first) = reduced.next() {
            self.out.register(param.id, first);
        }
        reduced.for_each(drop);
    }
}
