//! Named scalar metrics kept on the device until the caller logs them.
//!
//! Keys follow the `area/name` convention of verl and cleanrl (`actor/clipfrac`,
//! `advantage/mean`). Values stay tensors so that computing a metric never forces a
//! device-to-host copy inside loss code; [`Metrics::to_host`] reads them all at once.

use burn::tensor::Tensor;
use std::collections::BTreeMap;

/// An ordered list of `(key, scalar tensor)` pairs.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    entries: Vec<(String, Tensor<1>)>,
}

impl Metrics {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metric; `value` must hold one element. Its graph is detached.
    pub fn push(&mut self, key: impl Into<String>, value: Tensor<1>) {
        self.entries.push((key.into(), value.detach()));
    }

    /// Adds a host value as a metric on `device`.
    pub fn push_f32(&mut self, key: impl Into<String>, value: f32, device: &burn::tensor::Device) {
        self.entries
            .push((key.into(), Tensor::from_floats([value], device)));
    }

    /// Appends all metrics of `other`.
    pub fn extend(&mut self, other: Metrics) {
        self.entries.extend(other.entries);
    }

    /// The tensor stored under `key`, if any (the last one pushed).
    pub fn get(&self, key: &str) -> Option<&Tensor<1>> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    /// Keys in insertion order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(k, _)| k.as_str())
    }

    /// Reads every metric to the host in one transfer.
    pub fn to_host(&self) -> BTreeMap<String, f64> {
        if self.entries.is_empty() {
            return BTreeMap::new();
        }
        let values: Vec<Tensor<1>> = self.entries.iter().map(|(_, v)| v.clone()).collect();
        let flat: Vec<f32> = Tensor::cat(values, 0)
            .try_into_vec_as::<f32>()
            .expect("reading metrics back from the device");
        self.entries
            .iter()
            .zip(flat)
            .map(|((k, _), v)| (k.clone(), f64::from(v)))
            .collect()
    }

    /// Reads one metric to the host.
    pub fn value(&self, key: &str) -> Option<f64> {
        self.get(key)
            .map(|t| f64::from(t.clone().into_scalar::<f32>()))
    }
}
