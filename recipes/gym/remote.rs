//! The remote executor: each worker thread's evaluations go to one `ember gym serve` (thread
//! `slot` starts at address `slot mod n`); an address that does not answer, or answers 5xx, is
//! followed by the next, for three rounds, so a gym machine that goes down costs its share a
//! retry, not the run.

use ember_gym::{EvalConfig, EvaluateRequest, Executor, GymError, Job, Report};
use std::time::Duration;

/// Evaluations on `ember gym serve` machines.
pub struct Remote {
    urls: Vec<String>,
    agent: ureq::Agent,
    key: Option<String>,
    cfg: EvalConfig,
}

impl Remote {
    /// An executor over `urls` (`http://host:port`) asking for `cfg`'s hidden shapes and CPU
    /// limit, with `EMBER_GYM_API_KEY` as the bearer key when it is set.
    pub fn new(urls: &[String], cfg: EvalConfig) -> Self {
        let key = std::env::var("EMBER_GYM_API_KEY").ok();
        Self::with_key(urls, cfg, key.as_deref())
    }

    /// The same with `key` as the bearer key.
    pub fn with_key(urls: &[String], cfg: EvalConfig, key: Option<&str>) -> Self {
        let timeout = cfg.compile.wall_s * 2.0 + cfg.run.wall_s + 30.0;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs_f64(timeout)))
            .http_status_as_error(false)
            .build()
            .into();
        Self {
            urls: urls
                .iter()
                .map(|u| u.trim_end_matches('/').to_string())
                .collect(),
            agent,
            key: key.map(str::to_string),
            cfg,
        }
    }

    /// One POST to `base`; `Ok(None)` when the machine did not answer (try the next).
    fn post(&self, base: &str, req: &EvaluateRequest) -> Result<Option<Report>, GymError> {
        let url = format!("{base}/v1/evaluate");
        let mut call = self.agent.post(&url);
        if let Some(k) = &self.key {
            call = call.header("authorization", &format!("Bearer {k}"));
        }
        let mut resp = match call.send_json(req) {
            Ok(r) => r,
            Err(e) => {
                log::warn!("kernel gym {url}: no answer ({e})");
                return Ok(None);
            }
        };
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .with_config()
            .limit(16 << 20)
            .read_to_string()
            .unwrap_or_default();
        match status {
            200 => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| GymError::Remote(format!("{url}: the report is not JSON ({e})"))),
            500.. => {
                log::warn!("kernel gym {url}: HTTP {status}: {text}");
                Ok(None)
            }
            _ => Err(GymError::Remote(format!("{url}: HTTP {status}: {text}"))),
        }
    }
}

impl Executor for Remote {
    /// A source the screen refuses is refused here, as the gym would, without a request; then
    /// each address in turn, three rounds with 1 s and 2 s between them.
    fn evaluate(&self, job: &Job<'_>, slot: usize) -> Result<Report, GymError> {
        if let Err(v) = ember_gym::screen_source(&job.code) {
            return Ok(Report::unevaluated(job.task, v));
        }
        let req = EvaluateRequest {
            task: job.task.name.to_string(),
            code: job.code.clone(),
            seed: job.seed,
            hidden_shapes: self.cfg.hidden_shapes,
            cpu_s: self.cfg.run.cpu_s,
        };
        let n = self.urls.len();
        for round in 0..3u32 {
            if round > 0 {
                std::thread::sleep(Duration::from_secs(u64::from(round)));
            }
            for k in 0..n {
                if let Some(r) = self.post(&self.urls[(slot + k) % n], &req)? {
                    return Ok(r);
                }
            }
        }
        Err(GymError::Remote(format!(
            "none of {} answered (see the warnings above)",
            self.urls.join(", ")
        )))
    }
}
