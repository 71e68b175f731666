//! JSONL datasets: the prompt (a string or a chat conversation) and the answer under chosen
//! keys, extra columns kept for rewards, a fixed held-out split, `file:line` errors.

use super::example::Example;
use super::file::{DataError, read_regular};
use crate::reward::Check;
use ember_engine::SplitMix64;
use std::path::{Path, PathBuf};

/// A JSONL dataset read in place. Each line is an object with a prompt and an answer:
/// the prompt under `prompt_key` (by default the first of `question`, `prompt`, `messages`),
/// either a string or a chat conversation (a list of `{"role", "content"}`), and the answer
/// under `answer_key` (default `answer`), a string or a number (GSM8K: the text after its `####`
/// is the reference). Every other key is an extra column, passed to rewards. A line is held
/// out when a hash of its prompt is 0 mod 10, whatever the seed.
#[derive(Debug, Clone)]
pub struct JsonlData {
    train: Vec<Example>,
    held_out: Vec<Example>,
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// Names the reward functions receive besides the dataset's extra columns (TRL's `prompts`,
/// `completions`, `completion_ids`, `trainer_state`, `log_metric` and `log_extra`, Ember's
/// `answer` and `group`), so no extra column may take them.
pub const RESERVED_COLUMNS: [&str; 8] = [
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_metric",
    "log_extra",
    "answer",
    "group",
];

/// Which keys of a JSONL line hold the prompt and the answer (`None`: the defaults).
#[derive(Debug, Clone, Default)]
pub struct JsonlKeys {
    /// The prompt's key.
    pub prompt: Option<String>,
    /// The answer's key.
    pub answer: Option<String>,
}

/// A prompt value: a string, or a conversation whose last user turn is the question.
fn parse_prompt(v: &serde_json::Value) -> Result<(String, Vec<(String, String)>), String> {
    match v {
        serde_json::Value::String(s) => Ok((s.clone(), Vec::new())),
        serde_json::Value::Array(turns) => {
            let mut msgs = Vec::with_capacity(turns.len());
            for (i, t) in turns.iter().enumerate() {
                let field = |k: &str| t.get(k).and_then(|x| x.as_str()).map(str::to_string);
                let (Some(role), Some(content)) = (field("role"), field("content")) else {
                    return Err(format!(
                        "message {i} needs string fields `role` and `content`"
                    ));
                };
                if !["system", "user", "assistant"].contains(&role.as_str()) {
                    return Err(format!(
                        "message {i} has role {role:?}; expected system, user or assistant"
                    ));
                }
                msgs.push((role, content));
            }
            match msgs.last() {
                Some((role, _)) if role == "user" => {}
                Some((role, _)) => {
                    return Err(format!(
                        "the conversation ends with a message from {role}; the policy answers \
                         the last user message"
                    ));
                }
                None => return Err("the conversation is empty".into()),
            }
            let question = msgs.last().map(|m| m.1.clone()).unwrap_or_default();
            Ok((question, msgs))
        }
        other => Err(format!(
            "the prompt is {}, not a string or a list of messages",
            kind_of(other)
        )),
    }
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// One row of a dataset: its file, its 1-based line (or row) number, and the JSON value (or
/// why the line is not JSON).
pub type Record = (PathBuf, usize, Result<serde_json::Value, String>);

/// The rows of a dataset: a JSON-lines file (blank lines skipped), a folder `datasets` saved
/// (`save_to_disk`: its Arrow files, a dictionary's `train` split), or Parquet (a `.parquet`
/// file, or a Hub dataset directory's `train` shards), each Arrow or Parquet row read as the
/// JSON object its line would be.
pub fn records(path: &Path) -> Result<Vec<Record>, DataError> {
    let rows = if super::arrow::is_saved_dataset(path) {
        Some(super::arrow::rows(path)?)
    } else if super::parquet::is_parquet(path) {
        Some(super::parquet::rows(path)?)
    } else {
        None
    };
    if let Some(rows) = rows {
        return Ok(rows.into_iter().map(|(p, i, v)| (p, i, Ok(v))).collect());
    }
    let text = read_regular(path).map_err(|source| DataError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let v = serde_json::from_str(l).map_err(|e| format!("not JSON: {e}"));
            (path.to_path_buf(), i + 1, v)
        })
        .collect())
}

/// One line (or row) as an example: the prompt and answer under `keys`, every other key an
/// extra column.
fn example(v: serde_json::Value, keys: &JsonlKeys) -> Result<Example, String> {
    let serde_json::Value::Object(mut obj) = v else {
        return Err(format!("{} is not a JSON object", kind_of(&v)));
    };
    let prompt_key = match &keys.prompt {
        Some(k) => k.clone(),
        None => ["question", "prompt", "messages"]
            .into_iter()
            .find(|k| obj.contains_key(*k))
            .unwrap_or("prompt")
            .to_string(),
    };
    let answer_key = keys.answer.clone().unwrap_or_else(|| "answer".into());
    let (Some(p), Some(a)) = (obj.remove(&prompt_key), obj.remove(&answer_key)) else {
        let expected = match keys.prompt {
            None => "`question`, `prompt` or `messages`".to_string(),
            Some(_) => format!("`{prompt_key}`"),
        };
        return Err(format!(
            "expected a prompt under {expected} and an answer under `{answer_key}` (set \
             task.prompt_key / task.answer_key for other names); the line has {:?}",
            obj.keys().collect::<Vec<_>>()
        ));
    };
    let (question, messages) =
        parse_prompt(&p).map_err(|reason| format!("`{prompt_key}`: {reason}"))?;
    let answer = match &a {
        serde_json::Value::String(s) => match s.rsplit_once("####") {
            Some((_, tail)) => tail.trim().replace(',', ""),
            None => s.trim().to_string(),
        },
        serde_json::Value::Number(n) => n.to_string(),
        other => {
            return Err(format!(
                "`{answer_key}` is {}, not a string or a number",
                kind_of(other)
            ));
        }
    };
    if answer.is_empty() {
        return Err("the answer is empty".into());
    }
    // TRL passes every column under its own name: the answer column too, as written (Ember's
    // `answer` is the extracted reference).
    if answer_key != "answer" {
        obj.insert(answer_key.clone(), a);
    }
    // Rewards receive the columns as keyword arguments beside these.
    if let Some(k) = RESERVED_COLUMNS.iter().find(|k| obj.contains_key(**k)) {
        return Err(format!(
            "the extra column `{k}` would clash with the reward functions' own `{k}` argument \
             (reserved: {}); rename it",
            RESERVED_COLUMNS.join(", ")
        ));
    }
    Ok(Example {
        prompt: question.clone(),
        answer,
        question,
        check: Check::Numeric,
        messages,
        columns: obj,
    })
}

impl JsonlData {
    /// Reads `path` with the default keys.
    pub fn load(path: &Path) -> Result<Self, DataError> {
        Self::load_with(path, &JsonlKeys::default())
    }

    /// Reads `path` (JSON lines, or Parquet: a `.parquet` file or a Hub dataset directory),
    /// the prompt and answer under `keys`.
    pub fn load_with(path: &Path, keys: &JsonlKeys) -> Result<Self, DataError> {
        let rows = records(path)?;
        let (mut train, mut held_out) = (Vec::new(), Vec::new());
        for (file, line, v) in rows {
            let at = |reason: String| DataError::Line {
                path: file.clone(),
                line,
                reason,
            };
            let e = example(v.map_err(at)?, keys).map_err(at)?;
            if SplitMix64(fnv(&e.question)).next_u64().is_multiple_of(10) {
                held_out.push(e);
            } else {
                train.push(e);
            }
        }
        let empty = |reason: &str| DataError::Empty {
            path: path.to_path_buf(),
            reason: reason.into(),
        };
        if train.is_empty() && held_out.is_empty() {
            return Err(empty("no examples"));
        }
        if train.is_empty() || held_out.is_empty() {
            return Err(empty(
                "too few examples to split into training and held-out (1 in 10 is held out)",
            ));
        }
        Ok(Self { train, held_out })
    }

    /// `n` training examples drawn uniformly.
    pub fn train(&self, rng: &mut SplitMix64, n: usize) -> Vec<Example> {
        (0..n)
            .map(|_| self.train[rng.below(self.train.len() as u64) as usize].clone())
            .collect()
    }

    /// The first `n` held-out examples (file order).
    pub fn held_out_set(&self, n: usize) -> Vec<Example> {
        self.held_out.iter().take(n).cloned().collect()
    }

    /// The training examples.
    pub fn train_examples(&self) -> &[Example] {
        &self.train
    }

    /// (training, held-out) sizes.
    pub fn sizes(&self) -> (usize, usize) {
        (self.train.len(), self.held_out.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parquet_reads_as_jsonl_does() {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/data");
        let keys = JsonlKeys {
            prompt: None,
            answer: Some("solution".into()),
        };
        let lines = JsonlData::load_with(&d.join("chat.jsonl"), &keys).unwrap();
        assert_eq!(lines.train.len() + lines.held_out.len(), 60);
        assert_eq!(lines.train[0].messages.len(), 2);
        for f in ["chat-snappy.parquet", "chat-zstd.parquet"] {
            let rows = JsonlData::load_with(&d.join(f), &keys).unwrap();
            assert_eq!(
                (rows.train, rows.held_out),
                (lines.train.clone(), lines.held_out.clone())
            );
        }
        // The Hub's layout: the train split's two shards (the first 40 rows), not `test`.
        let hub = JsonlData::load_with(&d.join("hub"), &keys).unwrap();
        // Row i asks "What is {10 + i} + …?": the shards hold rows 0..40, read as JSONL reads them.
        let row = |e: &Example| -> usize {
            let a = e
                .question
                .split_whitespace()
                .nth(2)
                .unwrap_or("")
                .parse()
                .unwrap_or(99);
            a - 10
        };
        assert_eq!(hub.train.len() + hub.held_out.len(), 40);
        let all: Vec<&Example> = lines.train.iter().chain(&lines.held_out).collect();
        for e in hub.train.iter().chain(&hub.held_out) {
            assert!(row(e) < 40 && all.contains(&e), "{e:?}");
        }
        // Errors name the file and the row.
        let e = JsonlData::load_with(&d.join("bad.parquet"), &keys).unwrap_err();
        assert!(
            e.to_string().contains("bad.parquet:3: `solution` is null"),
            "{e}"
        );
        let e = JsonlData::load_with(&d.join("chat.jsonl").with_extension("parquet"), &keys);
        assert!(e.is_err());
    }

    /// `save_to_disk` folders (scripts/make_arrow_fixtures.py): a dataset in two Arrow shards
    /// reads as its JSONL does, a dictionary's `train` split is read, and errors name the file
    /// and the row, a file name that leaves the folder, and a dictionary without `train`.
    #[test]
    fn saved_datasets_read_as_jsonl_does() {
        let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/data");
        let keys = JsonlKeys {
            prompt: None,
            answer: Some("solution".into()),
        };
        let lines = JsonlData::load_with(&d.join("chat.jsonl"), &keys).unwrap();
        let saved = JsonlData::load_with(&d.join("saved"), &keys).unwrap();
        assert_eq!(
            (saved.train, saved.held_out),
            (lines.train.clone(), lines.held_out.clone())
        );
        let dict = JsonlData::load_with(&d.join("saved-dict"), &keys).unwrap();
        let all: Vec<&Example> = lines.train.iter().chain(&lines.held_out).collect();
        assert_eq!(dict.train.len() + dict.held_out.len(), 40);
        for e in dict.train.iter().chain(&dict.held_out) {
            assert!(all.contains(&e) && !e.question.contains(" 50 + "), "{e:?}");
        }
        let e = JsonlData::load_with(&d.join("saved-bad"), &keys).unwrap_err();
        assert!(
            e.to_string()
                .contains("data-00000-of-00001.arrow:3: `solution` is null"),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("ember-saved-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = r#"{"_data_files": [{"filename": "../chat.arrow"}]}"#;
        std::fs::write(dir.join("state.json"), state).unwrap();
        let e = JsonlData::load_with(&dir, &keys).unwrap_err().to_string();
        assert!(
            e.contains("\"../chat.arrow\" is not an .arrow file of this folder"),
            "{e}"
        );
        std::fs::write(dir.join("dataset_dict.json"), r#"{"splits": ["test"]}"#).unwrap();
        let e = JsonlData::load_with(&dir, &keys).unwrap_err().to_string();
        assert!(e.contains("without a `train` split"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn jsonl_gsm8k_and_generic_and_errors() {
        let dir = std::env::temp_dir().join(format!("ember-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.jsonl");
        let mut text = String::new();
        for i in 0..40 {
            text += &format!("{{\"question\": \"q{i}\", \"answer\": \"work\\n#### 1,{i:03}\"}}\n");
        }
        text += "{\"prompt\": \"p\", \"answer\": \" 7 \"}\n";
        std::fs::write(&p, &text).unwrap();
        let d = JsonlData::load(&p).unwrap();
        let (a, b) = d.sizes();
        assert_eq!(a + b, 41);
        assert!(b >= 1 && a >= 1);
        let all: Vec<Example> = d.train.iter().chain(&d.held_out).cloned().collect();
        let q3 = all.iter().find(|e| e.question == "q3").unwrap();
        assert_eq!(q3.answer, "1003");
        assert_eq!(all.iter().find(|e| e.question == "p").unwrap().answer, "7");

        std::fs::write(&p, "{\"question\": 3}\n").unwrap();
        let e = JsonlData::load(&p).unwrap_err().to_string();
        assert!(e.contains("d.jsonl:1:") && e.contains("question"), "{e}");
        std::fs::write(&p, "\n\n").unwrap();
        let e = JsonlData::load(&p).unwrap_err().to_string();
        assert!(e.contains("is empty"), "{e}");
        let e = JsonlData::load(&dir.join("missing.jsonl"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.jsonl"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Chosen keys, chat `messages` lists, numeric answers and extra columns; `file:line`
    /// errors for each malformed shape.
    #[test]
    fn jsonl_keys_messages_and_columns() {
        let dir = std::env::temp_dir().join(format!("ember-jsonl-chat-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("chat.jsonl");
        let mut text = String::new();
        for i in 0..30 {
            text += &format!(
                "{{\"messages\": [{{\"role\": \"system\", \"content\": \"Be brief.\"}}, \
                 {{\"role\": \"user\", \"content\": \"What is {i} + 1?\"}}], \
                 \"solution\": {}, \"level\": {}, \"source\": \"s{i}\"}}\n",
                i + 1,
                i % 3
            );
        }
        std::fs::write(&p, &text).unwrap();
        let keys = JsonlKeys {
            prompt: None,
            answer: Some("solution".into()),
        };
        let d = JsonlData::load_with(&p, &keys).unwrap();
        let all: Vec<Example> = d.train.iter().chain(&d.held_out).cloned().collect();
        assert_eq!(all.len(), 30);
        let e = all.iter().find(|e| e.question == "What is 4 + 1?").unwrap();
        assert_eq!(e.answer, "5");
        assert_eq!(e.messages.len(), 2);
        assert_eq!(e.messages[0], ("system".into(), "Be brief.".into()));
        assert_eq!(e.columns["level"], serde_json::json!(1));
        assert_eq!(e.columns["source"], serde_json::json!("s4"));
        // The answer column keeps its own name too (TRL's `solution`), as written.
        assert!(!e.columns.contains_key("messages"));
        assert_eq!(e.columns["solution"], serde_json::json!(5));

        // A chosen prompt key holding a plain string.
        std::fs::write(&p, "{\"problem\": \"2+2\", \"answer\": \"4\"}\n".repeat(12)).unwrap();
        let keys = JsonlKeys {
            prompt: Some("problem".into()),
            answer: None,
        };
        let d = JsonlData::load_with(&p, &keys);
        // Twelve identical prompts hash alike: all train or all held out, which is an error
        // naming the split.
        assert!(d.is_err_and(|e| e.to_string().contains("too few examples")));

        for (line, needle) in [
            (
                "{\"messages\": [{\"role\": \"user\"}], \"answer\": \"1\"}",
                "message 0 needs",
            ),
            (
                "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \
                 \"assistant\", \"content\": \"b\"}], \"answer\": \"1\"}",
                "ends with a message from assistant",
            ),
            (
                "{\"messages\": [], \"answer\": \"1\"}",
                "conversation is empty",
            ),
            (
                "{\"messages\": [{\"role\": \"tool\", \"content\": \"a\"}], \"answer\": \"1\"}",
                "role \"tool\"",
            ),
            (
                "{\"prompt\": \"a\", \"answer\": [1]}",
                "not a string or a number",
            ),
            (
                "{\"prompt\": {\"x\": 1}, \"answer\": \"1\"}",
                "not a string or a list",
            ),
            ("{\"text\": \"a\", \"label\": \"1\"}", "task.prompt_key"),
            ("[1, 2]", "not a JSON object"),
            (
                "{\"prompt\": \"a\", \"answer\": \"1\", \"group\": 2}",
                "column `group` would clash",
            ),
        ] {
            std::fs::write(&p, format!("{line}\n")).unwrap();
            let e = JsonlData::load(&p).unwrap_err().to_string();
            assert!(
                e.contains("chat.jsonl:1:") && e.contains(needle),
                "{line}: {e}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
