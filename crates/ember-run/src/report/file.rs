//! verl's `file` logger (`trainer.logger=['file']`, `verl/utils/tracking.py` `FileLogger`): a
//! JSONL file of `{"step": N, "data": {...}}` lines, the row's scalars under `data` and the
//! values that are not finite written as `null`. The file is `$VERL_FILE_LOGGER_PATH`, else
//! `$VERL_FILE_LOGGER_ROOT/<project>/<run name>.jsonl` (the root defaults to the current
//! directory), as verl places it. A new run starts the file afresh, as verl does; a resumed
//! run keeps its lines up to the resumed step (verl would lose them).

use super::base::{Client, End, Failure, RunInfo, Stamped};
use anyhow::Result;
use serde_json::{Map, Value, json};
use std::io::Write;
use std::path::PathBuf;

/// verl's JSONL metrics file.
pub(crate) struct File {
    path: PathBuf,
    keep_until: Option<usize>,
    file: Option<std::fs::File>,
}

impl File {
    /// The file's place from verl's variables.
    pub fn new(info: &RunInfo) -> Result<Self> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let path = match var("VERL_FILE_LOGGER_PATH") {
            Some(p) => PathBuf::from(p),
            None => var("VERL_FILE_LOGGER_ROOT")
                .map_or_else(|| PathBuf::from("."), |r| expand_home(&r.to_string_lossy()))
                .join(&info.project)
                .join(format!("{}.jsonl", info.run_name)),
        };
        Ok(Self {
            path,
            keep_until: info.resumed,
            file: None,
        })
    }

    fn failure(&self, what: &str, e: std::io::Error) -> Failure {
        Failure::Retry(format!("{what} {}: {e}", self.path.display()))
    }
}

impl Client for File {
    fn open(&mut self) -> Result<(), Failure> {
        if let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| self.failure("creating the folder of", e))?;
        }
        let kept = match self.keep_until {
            Some(last) => kept_lines(&std::fs::read(&self.path).unwrap_or_default(), last),
            None => String::new(),
        };
        crate::write::write_atomic(&self.path, kept.as_bytes())
            .map_err(|e| Failure::Retry(format!("{e:#}")))?;
        let f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)
            .map_err(|e| self.failure("opening", e))?;
        self.file = Some(f);
        Ok(())
    }

    fn send(&mut self, rows: &[Stamped]) -> Result<usize, Failure> {
        let mut text = String::new();
        for r in rows {
            text += &line(r);
            text.push('\n');
        }
        let Some(f) = self.file.as_mut() else {
            return Err(Failure::Retry("the file is not open".into()));
        };
        // One write of whole lines, then a flush; a failure cuts the file back to where it
        // was, so the retry leaves no torn line behind.
        let before = f.metadata().map(|m| m.len());
        let written = f.write_all(text.as_bytes()).and_then(|()| f.flush());
        if let Err(e) = written {
            if let Ok(len) = before {
                let _ = f.set_len(len);
            }
            return Err(self.failure("appending to", e));
        }
        Ok(rows.len())
    }

    fn close(&mut self, _end: End) -> Result<(), Failure> {
        self.file = None;
        Ok(())
    }
}

/// `~/…` under `$HOME`, as verl's `os.path.expanduser` reads the root.
fn expand_home(p: &str) -> PathBuf {
    match (p.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(p),
    }
}

/// One line: `{"step": N, "data": {...}}` (the row's `step` is the line's; values that are not
/// finite are `null`, as verl's `orjson` writes them).
fn line(r: &Stamped) -> String {
    let data: Map<String, Value> = r
        .row
        .iter()
        .filter(|(k, _)| k.as_str() != "step")
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::Number::from_f64(*v).map_or(Value::Null, Value::Number),
            )
        })
        .collect();
    json!({ "step": r.step, "data": data }).to_string()
}

/// The complete lines of an earlier file whose step is at most `last`, verbatim.
fn kept_lines(bytes: &[u8], last: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    let mut out = String::new();
    for l in complete.lines() {
        let step = serde_json::from_str::<Value>(l)
            .ok()
            .and_then(|v| v["step"].as_u64());
        if step.is_some_and(|s| s <= last as u64) {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn lines_are_verls_and_resuming_keeps_the_earlier_steps() {
        let row: BTreeMap<String, f64> = [("step", 3.0), ("actor/loss", 0.5), ("eval/x", f64::NAN)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let l = line(&Stamped {
            step: 3,
            ms: 0,
            row,
        });
        assert_eq!(l, r#"{"data":{"actor/loss":0.5,"eval/x":null},"step":3}"#);
        let earlier = "{\"step\":0,\"data\":{}}\n{\"step\":1,\"data\":{}}\n{\"step\":2,\"data\":{}}\n{\"step\":3,";
        assert_eq!(
            kept_lines(earlier.as_bytes(), 1),
            "{\"step\":0,\"data\":{}}\n{\"step\":1,\"data\":{}}\n"
        );
    }
}
