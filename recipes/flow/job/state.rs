//! What an image run's checkpoint holds beside the run kit's records: the adapters (and RAM's
//! average of them) and [`FlowState`]; the pretrained DiT with its adapters.

use crate::flow::images::EvalResult;
use crate::flow::schema::FlowRecipe;
use anyhow::{Result, anyhow};
use burn::module::{Lora, Module, ParamGroup};
use burn::store::ModuleRecord;
use ember_engine::keys;
use ember_flow::FlowDit;
use ember_run::checkpoint;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The held-out evaluation as a metrics row.
pub(super) fn eval_row(step: usize, e: &EvalResult) -> BTreeMap<String, f64> {
    BTreeMap::from([
        ("step".to_string(), step as f64),
        (keys::EVAL_ACCURACY.to_string(), e.accuracy),
        ("eval/class_prob".to_string(), e.class_prob),
        ("eval/diversity".to_string(), e.diversity),
        ("eval/entropy".to_string(), e.entropy),
        ("eval/jpeg_kb".to_string(), e.jpeg_kb),
    ])
}

/// The adapters' record (the frozen weights come from pretraining).
pub(super) fn adapters_record(model: &FlowDit) -> ModuleRecord {
    model
        .clone()
        .into_record_group(ParamGroup::from_predicate(".lora."))
}

/// State kept in `state.json` beside the adapters and optimizer records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct FlowState {
    pub(super) before: EvalResult,
    pub(super) after: EvalResult,
    pub(super) pretrain_seconds: f64,
}

/// Fills a checkpoint directory: the adapters (and RAM's average of them), the optimizer, the
/// run state and [`FlowState`].
pub(super) fn save_state(
    d: &Path,
    model: &FlowDit,
    ema: Option<&FlowDit>,
    optim: &ember_train::Optimizer,
    ts: &checkpoint::TrainState,
    st: &FlowState,
) -> Result<()> {
    checkpoint::write_records(d, adapters_record(model), optim, ts)?;
    if let Some(e) = ema {
        adapters_record(e)
            .save(d.join(RAM_EMA))
            .map_err(|e| anyhow!("writing the RAM average's record: {e}"))?;
    }
    std::fs::write(d.join(FLOW_STATE), serde_json::to_string_pretty(st)?)?;
    Ok(())
}

/// The checkpoint file holding [`FlowState`].
pub(super) const FLOW_STATE: &str = "flow_state.json";
/// The checkpoint file holding RAM's moving average of the adapters (`rl.ram_ema`).
pub(super) const RAM_EMA: &str = "ram_ema.bpk";

/// The pretrained DiT frozen, with fresh adapters on the recipe's targets, its products in the
/// recipe's precision (as the backend allows it).
pub(super) fn with_adapters(
    model: FlowDit,
    r: &FlowRecipe,
    ad: &burn::tensor::Device,
) -> Result<FlowDit> {
    let paths = model.lora_paths(&r.rl.run.lora.targets);
    // The adapters' A factors are drawn from the device RNG: seed it (B = 0, so the model is
    // unchanged either way).
    ad.seed(r.header.seed ^ 0x4c4f_5241);
    let (precision, note) = crate::common::device::resolve_precision(
        r.precision,
        crate::common::device::kind(&r.header.device)?,
    );
    for note in note.into_iter().chain(r.reward_warning()) {
        log::warn!("[{}] {note}", r.header.name);
    }
    Ok(model
        .no_grad()
        .apply_lora(
            Lora::new(r.rl.run.lora.rank, r.rl.run.lora.alpha)
                .set_param_group(ParamGroup::from_paths(paths)),
        )
        .with_precision(precision))
}
