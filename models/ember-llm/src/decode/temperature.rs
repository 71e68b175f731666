//! The one validity rule of a sampling temperature, shared by both samplers (`sample.rs`,
//! `running.rs`), the loaders of `generation_config.json`, the recipes and `ember serve`, and
//! the one temperature their log-probs use.

/// The highest sampling temperature that any of Ember's surfaces takes: a recipe's rollouts,
/// `ember serve`'s requests (vLLM's rule: no cap at OpenAI's 2), `generation_config.json` and
/// the sampler itself. One bound, so that a recipe's value never passes `ember train` and fails
/// at the first request to a server.
pub const MAX_TEMPERATURE: f64 = 100.0;

/// The one validity rule of a sampling temperature: finite, in [0, [`MAX_TEMPERATURE`]] where
/// greedy decoding (0) is allowed, in (0, [`MAX_TEMPERATURE`]] where it is not (RL rollouts:
/// at 0 every sample of a prompt is the same answer).
pub fn temperature_ok(t: f64, greedy_allowed: bool) -> bool {
    t.is_finite() && t <= MAX_TEMPERATURE && (t > 0.0 || (greedy_allowed && t == 0.0))
}

/// The temperature the log-probs of a draw at `t` use, and that a trainer must rescore at to
/// agree with them: `t`, or 1 for greedy decoding (`t` = 0, where the distribution itself is
/// not scaled).
pub fn scoring_temperature(t: f32) -> f32 {
    if t > 0.0 { t } else { 1.0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SamplingConfig;

    /// One rule for every surface: [0, 100] with greedy decoding, (0, 100] without; NaN,
    /// infinities and negatives never.
    #[test]
    fn the_temperature_rule() {
        for (t, greedy, ok) in [
            (0.0, true, true),
            (0.0, false, false),
            (1e-6, false, true),
            (2.5, false, true),
            (100.0, true, true),
            (100.5, true, false),
            (-0.5, true, false),
            (f64::NAN, true, false),
            (f64::INFINITY, false, false),
        ] {
            assert_eq!(temperature_ok(t, greedy), ok, "{t} greedy {greedy}");
        }
        let mut c = SamplingConfig {
            temperature: 100.5,
            ..SamplingConfig::default()
        };
        assert!(c.validate().is_err());
        c.temperature = 0.0;
        assert!(c.validate().is_ok());
    }
}
