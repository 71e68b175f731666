//! A data-parallel update across processes: the gradients of each rank's share of a mini-batch
//! summed over the ranks (one flat buffer, in buckets), and the shares' host metrics gathered,
//! so that every rank takes the same optimizer step and logs the same numbers (PyTorch DDP's
//! summing all-reduce; verl's `dp_actor` with its normalisers taken over the whole mini-batch).

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};
use ember_dist::{DistError, World};
use ember_engine::EngineError;

fn failed(what: &'static str) -> impl Fn(DistError) -> EngineError {
    move |e| EngineError::Collective {
        what,
        message: e.to_string(),
    }
}

/// A trained parameter's place in the flat buffer.
struct Slot {
    id: ParamId,
    dims: Vec<usize>,
    dtype: DType,
    device: Device,
    offset: usize,
    len: usize,
}

/// The gradients of `model`'s trained parameters (those that require a gradient), summed over
/// the ranks, and their global L2 norm (summed in f64 on the host from the summed buffer, so
/// every rank clips by the same factor). A rank without a gradient for a parameter (an empty
/// share) adds zeros; a parameter no rank has a gradient for stays without one, as it would in
/// one process.
///
/// # Errors
/// The world's engine failed.
pub(crate) fn sum_gradients<M: Module>(
    world: &World,
    model: &M,
    grads: GradientsParams,
) -> Result<(GradientsParams, f64), EngineError> {
    let mut flat = Flatten {
        grads,
        slots: Vec::new(),
        values: Vec::new(),
        present: Vec::new(),
        unreadable: false,
    };
    model.visit(&mut flat);
    let Flatten {
        slots,
        mut values,
        present,
        unreadable,
        ..
    } = flat;
    if unreadable {
        return Err(EngineError::Collective {
            what: "gradient sum",
            message: "a gradient could not be read to the host".into(),
        });
    }
    // The presence flags travel in the same buffer: one collective per bucket.
    let n = values.len();
    values.extend(present);
    let summed = world
        .sum(values, "gradient sum")
        .map_err(failed("gradient sum"))?;
    let mut out = GradientsParams::new();
    let mut squares = 0f64;
    for (k, s) in slots.iter().enumerate() {
        if summed[n + k] <= 0.0 {
            continue;
        }
        let part = summed[s.offset..s.offset + s.len].to_vec();
        squares += part
            .iter()
            .map(|x| f64::from(*x) * f64::from(*x))
            .sum::<f64>();
        register(&mut out, s, part);
    }
    Ok((out, squares.sqrt()))
}

fn register(out: &mut GradientsParams, s: &Slot, part: Vec<f32>) {
    fn put<const D: usize>(out: &mut GradientsParams, s: &Slot, part: Vec<f32>) {
        let t = Tensor::<D>::from_data(TensorData::new(part, s.dims.clone()), &s.device);
        let t = match s.dtype {
            DType::F16 => t.cast(FloatDType::F16),
            DType::BF16 => t.cast(FloatDType::BF16),
            _ => t,
        };
        out.register(s.id, t);
    }
    match s.dims.len() {
        1 => put::<1>(out, s, part),
        2 => put::<2>(out, s, part),
        3 => put::<3>(out, s, part),
        4 => put::<4>(out, s, part),
        5 => put::<5>(out, s, part),
        _ => put::<6>(out, s, part),
    }
}

/// Visits the trained parameters in the model's order (the same on every rank) and appends each
/// one's gradient (or zeros) to `values`.
struct Flatten {
    grads: GradientsParams,
    slots: Vec<Slot>,
    values: Vec<f32>,
    present: Vec<f32>,
    /// A gradient could not be read to the host.
    unreadable: bool,
}

impl ModuleVisitor for Flatten {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        if !param.is_require_grad() || self.slots.iter().any(|s| s.id == param.id) {
            return;
        }
        let val = param.val();
        let dims = val.dims().to_vec();
        let len: usize = dims.iter().product();
        let offset = self.values.len();
        let grad = self.grads.remove::<D>(param.id);
        let dtype = grad.as_ref().map_or(val.dtype(), Tensor::dtype);
        let host = grad.and_then(|g| {
            let g = match g.dtype() {
                DType::F16 | DType::BF16 => g.cast(FloatDType::F32),
                _ => g,
            };
            match g.into_data().convert::<f32>().try_into_vec::<f32>() {
                Ok(v) if v.len() == len => Some(v),
                _ => {
                    self.unreadable = true;
                    None
                }
            }
        });
        self.present.push(f32::from(u8::from(host.is_some())));
        match host {
            Some(v) => self.values.extend(v),
            None => self.values.resize(offset + len, 0.0),
        }
        self.slots.push(Slot {
            id: param.id,
            dims,
            dtype,
            device: val.device(),
            offset,
            len,
        });
    }
}

/// Every rank's host metrics of a mini-batch (a list per micro-batch share), in rank order.
///
/// # Errors
/// The world's engine failed, or a rank's list did not parse.
pub(crate) fn gather_metrics(
    world: &World,
    mine: Vec<Vec<(String, f64)>>,
) -> Result<Vec<Vec<(String, f64)>>, EngineError> {
    // As bits: a metric may be NaN (a non-finite loss skips the step on every rank), which JSON
    // has no number for.
    let mine: Vec<Vec<(String, u64)>> = mine
        .into_iter()
        .map(|l| l.into_iter().map(|(k, v)| (k, v.to_bits())).collect())
        .collect();
    let bytes = serde_json::to_vec(&mine).map_err(|e| EngineError::Collective {
        what: "metrics gather",
        message: e.to_string(),
    })?;
    let parts = world
        .gather(bytes, "metrics gather")
        .map_err(failed("metrics gather"))?;
    let mut all = Vec::new();
    for p in parts {
        let lists: Vec<Vec<(String, u64)>> =
            serde_json::from_slice(&p).map_err(|e| EngineError::Collective {
                what: "metrics gather",
                message: format!("a rank's metrics did not parse: {e}"),
            })?;
        all.extend(lists.into_iter().map(|l| {
            l.into_iter()
                .map(|(k, b)| (k, f64::from_bits(b)))
                .collect::<Vec<_>>()
        }));
    }
    Ok(all)
}

/// `model` with rank 0's values of every trained parameter (those that require a gradient), as
/// PyTorch DDP broadcasts rank 0's module at its construction: ranks whose set-up differed in the
/// last bits (a warm-up on machines with other thread counts) start the same, and stay the same
/// because every step is.
///
/// # Errors
/// The world's engine failed, or rank 0's parameters do not fit this rank's model.
pub fn broadcast_trained<M: Module>(world: &World, model: M) -> Result<M, EngineError> {
    let flat = trained_values(&model);
    let mine: &[f32] = match world.is_writer() {
        true => &flat.values,
        false => &[],
    };
    let values = world
        .broadcast_floats(mine, "parameter broadcast")
        .map_err(failed("parameter broadcast"))?;
    if values.len() != flat.values.len() {
        return Err(EngineError::Collective {
            what: "parameter broadcast",
            message: format!(
                "rank 0 sent {} values, this rank's model has {} trained values",
                values.len(),
                flat.values.len()
            ),
        });
    }
    let mut out = GradientsParams::new();
    for s in &flat.slots {
        register(&mut out, s, values[s.offset..s.offset + s.len].to_vec());
    }
    Ok(model.map(&mut Put(out)))
}

/// Each trained parameter replaced by its value in the map (a fresh leaf that requires a
/// gradient).
struct Put(GradientsParams);

impl ModuleMapper for Put {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        match self.0.remove::<D>(param.id) {
            Some(v) => param.map(|_| v.require_grad()),
            None => param,
        }
    }
}

/// Checks that every rank holds the same trained parameters, bit for bit: each rank's CRC-32C
/// of their values (in the model's order) is gathered and compared with rank 0's.
///
/// # Errors
/// The world's engine failed, or the ranks whose parameters differ from rank 0's (named).
pub fn check_identical<M: Module>(world: &World, model: &M) -> Result<(), EngineError> {
    let flat = trained_values(model);
    let bytes: Vec<u8> = flat.values.iter().flat_map(|x| x.to_le_bytes()).collect();
    let sum = crc32c::crc32c(&bytes);
    let all = world
        .gather(sum.to_le_bytes().to_vec(), "parameter check")
        .map_err(failed("parameter check"))?;
    let differ: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, b)| **b != all[0])
        .map(|(k, _)| k.to_string())
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(EngineError::Collective {
        what: "parameter check",
        message: format!(
            "rank(s) {} hold other trained parameters than rank 0: the ranks have diverged",
            differ.join(", ")
        ),
    })
}

/// The trained parameters' values flattened as their gradients are (the values stand in the
/// gradients' map only to reuse the flattening).
fn trained_values<M: Module>(model: &M) -> Flatten {
    struct Values(GradientsParams);
    impl ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if param.is_require_grad() {
                self.0.register(param.id, param.val());
            }
        }
    }
    let mut values = Values(GradientsParams::new());
    model.visit(&mut values);
    let mut flat = Flatten {
        grads: values.0,
        slots: Vec::new(),
        values: Vec::new(),
        present: Vec::new(),
        unreadable: false,
    };
    model.visit(&mut flat);
    flat
}
