//! `metrics.jsonl` (a row per step, appended and flushed as the run goes) and the same scalars in
//! TensorBoard's event file, `samples.jsonl` (sampled completions), `metrics.csv` and
//! `curves.png` (rewritten atomically whenever [`MetricsLog::publish`] is called: at every
//! evaluation and at the end).

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The metrics of a run.
pub struct MetricsLog {
    /// Opened at the first row, so a run that fails during set-up leaves no `metrics.jsonl`
    /// (which would mark the directory as holding a run).
    jsonl: Option<std::fs::File>,
    /// `samples.jsonl`, opened at the first sample.
    samples: Option<std::fs::File>,
    /// The TensorBoard event file, opened with `metrics.jsonl`.
    tensorboard: Option<super::tensorboard::EventWriter>,
    keep_until: Option<usize>,
    resuming: bool,
    rows: Vec<BTreeMap<String, f64>>,
    dir: PathBuf,
    curves: (String, String),
}

impl MetricsLog {
    /// Starts `metrics.jsonl` in `dir`; when resuming, keeps the rows up to step `keep_until`
    /// (rewritten atomically, verbatim) and appends after them. `curves` names the (reward,
    /// accuracy) series of `curves.png`.
    pub fn open(dir: &Path, keep_until: Option<usize>, curves: (String, String)) -> Result<Self> {
        let path = dir.join("metrics.jsonl");
        let mut rows = Vec::new();
        if let Some(last) = keep_until {
            keep_jsonl_until(&dir.join(SAMPLES), last)?;
            let bytes = std::fs::read(&path)
                .with_context(|| format!("reading {} to resume", path.display()))?;
            // The kept lines are written back verbatim, not re-serialised from the parsed
            // values, so a resumed file holds the same bytes as an uninterrupted run's. A last
            // line without its newline was torn by a failed append (disk full, a kill): it
            // belongs to a step after the checkpoint, and is dropped.
            let mut kept = String::new();
            let complete = complete_lines(&bytes, &path)?;
            for (n, line) in complete.lines().enumerate() {
                let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line)
                    .with_context(|| format!("parsing line {} of {}", n + 1, path.display()))?;
                let row: BTreeMap<String, f64> = v
                    .into_iter()
                    .map(|(k, v)| (k, v.as_f64().unwrap_or(f64::NAN)))
                    .collect();
                if row.get("step").is_some_and(|s| *s <= last as f64) {
                    rows.push(row);
                    kept.push_str(line);
                    kept.push('\n');
                }
            }
            crate::write::write_atomic(&path, kept.as_bytes())?;
        }
        Ok(Self {
            jsonl: None,
            samples: None,
            tensorboard: None,
            keep_until,
            resuming: keep_until.is_some(),
            rows,
            dir: dir.to_path_buf(),
            curves,
        })
    }

    /// Opens the event file at the first row or samples (whichever comes first after a resume).
    fn open_tensorboard(&mut self) -> Result<()> {
        if self.tensorboard.is_none() {
            self.tensorboard = Some(super::tensorboard::EventWriter::open(
                &self.dir,
                self.keep_until,
            )?);
        }
        Ok(())
    }

    /// Appends a row (flushed at once).
    pub fn push(&mut self, row: BTreeMap<String, f64>) -> Result<()> {
        let path = self.dir.join("metrics.jsonl");
        if self.jsonl.is_none() {
            self.jsonl = Some(open_log(&path, self.resuming)?);
            self.open_tensorboard()?;
            if !self.resuming {
                // A new run replaces an older run's samples even if it writes none.
                let old = self.dir.join(SAMPLES);
                if old.exists() && self.samples.is_none() {
                    std::fs::remove_file(&old)
                        .with_context(|| format!("removing {}", old.display()))?;
                }
            }
        }
        if let Some(f) = self.jsonl.as_mut() {
            // One write of the whole line: a failure leaves at most a torn last line, which
            // resuming drops.
            let line = row_json(&row) + "\n";
            f.write_all(line.as_bytes())
                .and_then(|()| f.flush())
                .with_context(|| format!("appending to {}", path.display()))?;
        }
        if let Some(tb) = self.tensorboard.as_mut() {
            let step = row.get("step").map_or(0, |s| *s as i64);
            tb.scalars(step, &row)?;
        }
        self.rows.push(row);
        Ok(())
    }

    /// Appends sampled completions of step `step` to `samples.jsonl` (one JSON object a line,
    /// `step` added to each); with `text`, also writes them to TensorBoard's Text tab as one
    /// Markdown table under `samples`.
    pub fn samples(
        &mut self,
        step: usize,
        samples: &[serde_json::Map<String, serde_json::Value>],
        text: bool,
    ) -> Result<()> {
        let path = self.dir.join(SAMPLES);
        if self.samples.is_none() {
            self.samples = Some(open_log(&path, self.resuming)?);
        }
        self.open_tensorboard()?;
        let mut lines = String::new();
        for s in samples {
            let mut obj = serde_json::Map::new();
            obj.insert("step".into(), step.into());
            obj.extend(s.clone());
            lines += &(serde_json::Value::Object(obj).to_string() + "\n");
        }
        if let Some(f) = self.samples.as_mut() {
            f.write_all(lines.as_bytes())
                .and_then(|()| f.flush())
                .with_context(|| format!("appending to {}", path.display()))?;
        }
        if let (true, Some(tb), false) = (text, self.tensorboard.as_mut(), samples.is_empty()) {
            tb.text(step as i64, "samples", &markdown_table(samples))?;
        }
        Ok(())
    }

    /// Rewrites `metrics.csv` and `curves.png` from the rows so far.
    pub fn publish(&self) -> Result<()> {
        self.write_csv()?;
        let series = |key: &str| -> Vec<(f64, f64)> {
            self.rows
                .iter()
                .filter_map(|r| Some((*r.get("step")?, *r.get(key)?)))
                .collect()
        };
        super::plot::curves(
            &self.dir.join("curves.png"),
            &series(&self.curves.0),
            &series(&self.curves.1),
        )
    }

    fn write_csv(&self) -> Result<()> {
        let mut keys: Vec<String> = self.rows.iter().flat_map(|r| r.keys().cloned()).collect();
        keys.sort();
        keys.dedup();
        let mut out = keys.join(",") + "\n";
        for r in &self.rows {
            let line: Vec<String> = keys
                .iter()
                .map(|k| r.get(k).map(|v| v.to_string()).unwrap_or_default())
                .collect();
            out += &(line.join(",") + "\n");
        }
        crate::write::write_atomic(&self.dir.join("metrics.csv"), out.as_bytes())
    }
}

/// Opens a JSON-lines log for appending: emptied for a new run, kept when resuming (already cut
/// back to the checkpoint's step).
fn open_log(path: &Path, resuming: bool) -> Result<std::fs::File> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    if !resuming {
        f.set_len(0)
            .with_context(|| format!("truncating {}", path.display()))?;
    }
    Ok(f)
}

/// The complete lines of a log (up to its last newline), as text. A torn last line may end
/// inside a UTF-8 character, so the cut is made on the bytes first.
fn complete_lines<'a>(bytes: &'a [u8], path: &Path) -> Result<&'a str> {
    let end = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    std::str::from_utf8(&bytes[..end])
        .with_context(|| format!("{} holds a damaged line (not UTF-8)", path.display()))
}

/// The file of sampled completions.
pub const SAMPLES: &str = "samples.jsonl";

/// Keeps the lines of a JSON-lines log whose `step` is at most `last` (rewritten atomically,
/// verbatim; a torn last line is dropped). No file: nothing to do.
fn keep_jsonl_until(path: &Path, last: usize) -> Result<()> {
    let bytes = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let complete = complete_lines(&bytes, path)?;
    let mut kept = String::new();
    for line in complete.lines() {
        let step = serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64));
        if step.is_some_and(|s| s <= last as u64) {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    crate::write::write_atomic(path, kept.as_bytes())
}

/// Samples as a Markdown table (TensorBoard renders the Text tab as Markdown).
fn markdown_table(samples: &[serde_json::Map<String, serde_json::Value>]) -> String {
    let mut keys: Vec<&String> = samples.iter().flat_map(|s| s.keys()).collect();
    keys.sort();
    keys.dedup();
    let cell = |v: Option<&serde_json::Value>| -> String {
        let s = match v {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => String::new(),
        };
        s.replace('|', "\\|").replace('\n', "<br>")
    };
    let mut out = format!(
        "| {} |\n|{}\n",
        keys.iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(" | "),
        " --- |".repeat(keys.len())
    );
    for s in samples {
        let row: Vec<String> = keys.iter().map(|k| cell(s.get(*k))).collect();
        out += &format!("| {} |\n", row.join(" | "));
    }
    out
}

fn row_json(row: &BTreeMap<String, f64>) -> String {
    let json: serde_json::Map<String, serde_json::Value> = row
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                serde_json::Number::from_f64(*v)
                    .map_or(serde_json::Value::Null, serde_json::Value::Number),
            )
        })
        .collect();
    serde_json::Value::Object(json).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed append (disk full) leaves a torn last line; resuming drops it and keeps the
    /// complete rows up to the checkpoint, so the run stays resumable.
    #[test]
    fn resume_drops_a_torn_last_line() {
        let d = std::env::temp_dir().join(format!("ember-metrics-torn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let path = d.join("metrics.jsonl");
        std::fs::write(
            &path,
            "{\"step\":1,\"a\":0.5}\n{\"step\":2,\"a\":0.25}\n{\"step\":3,\"a",
        )
        .unwrap();
        let curves = ("a".to_string(), "b".to_string());
        let mut log = MetricsLog::open(&d, Some(2), curves.clone()).unwrap();
        assert_eq!(log.rows.len(), 2);
        log.push(BTreeMap::from([("step".to_string(), 3.0)]))
            .unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "{\"step\":1,\"a\":0.5}\n{\"step\":2,\"a\":0.25}\n{\"step\":3.0}\n"
        );
        // A damaged line before the end is not a torn append: an error naming the line.
        std::fs::write(&path, "{\"step\":1}\n{oops\n{\"step\":2}\n").unwrap();
        let err = MetricsLog::open(&d, Some(2), curves).err().unwrap();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
        std::fs::remove_dir_all(&d).ok();
    }

    /// A completion with non-ASCII text torn inside a character (disk full, a kill) leaves
    /// bytes that are not UTF-8: resuming still cuts `samples.jsonl` back to the checkpoint.
    #[test]
    fn resume_cuts_samples_torn_inside_a_character() {
        let d = std::env::temp_dir().join(format!("ember-samples-torn-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("metrics.jsonl"), "{\"step\":1}\n{\"step\":2}\n").unwrap();
        let mut bytes = "{\"step\":1,\"completion\":\"café\"}\n{\"step\":2,\"completion\":\"é\"}\n"
            .as_bytes()
            .to_vec();
        bytes.extend(b"{\"step\":3,\"completion\":\"caf\xc3");
        std::fs::write(d.join(SAMPLES), &bytes).unwrap();
        let curves = ("a".to_string(), "b".to_string());
        MetricsLog::open(&d, Some(1), curves).unwrap();
        assert_eq!(
            std::fs::read_to_string(d.join(SAMPLES)).unwrap(),
            "{\"step\":1,\"completion\":\"café\"}\n"
        );
        std::fs::remove_dir_all(&d).ok();
    }
}
