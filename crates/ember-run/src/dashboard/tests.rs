//! The dashboard's feed against a renderer that records what burn-train's TUI would be sent.

use super::Feed;
use burn_train::logger::{EvaluationProgressLogger, TrainingProgressLogger};
use burn_train::metric::{MetricDefinition, MetricEntry, MetricId, NumericEntry};
use burn_train::renderer::{
    EvaluationName, MetricState, MetricsRenderer, MetricsRendererEvaluation,
    MetricsRendererTraining,
};
use std::collections::{BTreeMap, HashSet};

/// What a renderer was sent, in order.
#[derive(Default)]
struct Recorder {
    registered: HashSet<MetricId>,
    events: Vec<String>,
}

impl Recorder {
    fn value(&mut self, state: MetricState) {
        let MetricState::Numeric(MetricEntry { metric_id, .. }, Some(NumericEntry::Value(v))) =
            state
        else {
            panic!("not a numeric value: {state:?}");
        };
        // burn-train's TUI panics its render thread on an unregistered id.
        assert!(
            self.registered.contains(&metric_id),
            "{metric_id:?} not registered"
        );
        self.events.push(format!("{metric_id:?}={v}"));
    }
}

impl MetricsRendererTraining for Recorder {
    fn update_train(&mut self, state: MetricState) {
        self.value(state);
    }
    fn update_valid(&mut self, state: MetricState) {
        self.value(state);
    }
}

impl MetricsRendererEvaluation for Recorder {
    fn update_test(&mut self, _: EvaluationName, state: MetricState) {
        self.value(state);
    }
}

impl TrainingProgressLogger for Recorder {
    fn start(&mut self, epochs: usize, first: usize, items: Option<usize>, label: Option<&str>) {
        self.events
            .push(format!("start {epochs} {first} {items:?} {label:?}"));
    }
    fn update_epoch(&mut self, _: usize) {}
    fn start_split(&mut self, split: &str, total: usize) {
        self.events.push(format!("split {split} {total}"));
    }
    fn update_split(&mut self, done: usize) {
        self.events.push(format!("done {done}"));
    }
    fn end_split(&mut self) {}
    fn end(&mut self) {}
    fn log_event_training(&mut self, _: String) {}
}

impl EvaluationProgressLogger for Recorder {
    fn start_global_progress(&mut self, _: usize) {}
    fn start_test(&mut self, _: &str, _: usize) {}
    fn update_test_progress(&mut self, _: usize) {}
    fn end_test(&mut self) {}
    fn end_global_progress(&mut self) {}
    fn log_event_evaluation(&mut self, _: String) {}
}

impl MetricsRenderer for Recorder {
    fn manual_close(&mut self) {}
    fn register_metric(&mut self, d: MetricDefinition) {
        assert!(
            self.registered.insert(d.metric_id.clone()),
            "{:?} registered twice",
            d.name
        );
        self.events.push(format!("register {}", d.name));
    }
}

#[test]
fn each_metric_is_registered_once_before_its_values_and_the_progress_follows() {
    let mut feed = Feed::new(
        Recorder::default(),
        "run",
        10,
        3,
        &["reward/mean", "eval/acc"],
    );
    let row = |kv: &[(&str, f64)]| -> BTreeMap<String, f64> {
        kv.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    };
    feed.step(4, &row(&[("actor/loss", 0.5), ("reward/mean", 0.25)]));
    feed.step(
        5,
        &row(&[
            ("actor/loss", f64::INFINITY),
            ("eval/acc", 0.75),
            ("reward/mean", 0.5),
        ]),
    );
    feed.note("warm-up 3/9");
    feed.stopping();
    feed.note("ignored while stopping");
    let id = |s: &str| format!("{:?}", MetricId::new(std::sync::Arc::new(s.to_string())));
    let expected = [
        "register reward/mean".to_string(),
        "register eval/acc".into(),
        "start 1 1 Some(10) Some(\"run\")".into(),
        "split train 10".into(),
        "done 3".into(),
        "register actor/loss".into(),
        format!("{}=0.25", id("reward/mean")),
        format!("{}=0.5", id("actor/loss")),
        "done 4".into(),
        format!("{}=0.5", id("reward/mean")),
        format!("{}=0.75", id("eval/acc")),
        "done 5".into(),
        "start 1 1 Some(10) Some(\"run · warm-up 3/9\")".into(),
        "split train 10".into(),
        "done 5".into(),
        "start 1 1 Some(10) Some(\"run · stopping after this step\")".into(),
        "split train 10".into(),
        "done 5".into(),
    ];
    assert_eq!(feed.renderer.events, expected);
}
