//! Tokenizers and chat templates: Hugging Face `tokenizer.json` through the `tokenizers` crate,
//! or a byte-level BPE rebuilt from GGUF metadata; Jinja chat templates rendered by `minijinja`.

use crate::error::{LlmError, Result};
use crate::load::gguf::{GgufFile, Value};
use serde_json::json;
use std::path::Path;

/// A tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// Chat template (Jinja), if the model has one.
    pub chat_template: Option<String>,
    /// Beginning-of-sequence token.
    pub bos_token: Option<String>,
    /// End-of-sequence token.
    pub eos_token: Option<String>,
    /// End-of-sequence ids (generation stops on any of them).
    pub eos_ids: Vec<u32>,
    /// Extra variables of the chat template (transformers' `apply_chat_template(**kwargs)`,
    /// vLLM's `chat_template_kwargs`), e.g. Qwen3's `enable_thinking = false`.
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab_size())
            .field("eos_ids", &self.eos_ids)
            .finish()
    }
}

fn tok_err(e: impl std::fmt::Display) -> LlmError {
    LlmError::Tokenizer(e.to_string())
}

/// A chat message.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

impl Tokenizer {
    /// The tokenizer of a checkpoint: `tokenizer.json` in a Hugging Face directory, or the
    /// metadata of a GGUF file.
    pub fn for_checkpoint(model: &Path) -> Result<Self> {
        if model.is_dir() {
            Self::from_hf_dir(model)
        } else {
            Self::from_gguf(&GgufFile::open(model)?)
        }
    }

    /// Loads `tokenizer.json` and, if present, `tokenizer_config.json` (chat template, special
    /// tokens) from a Hugging Face model directory.
    pub fn from_hf_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(LlmError::Tokenizer(format!(
                "{} does not exist",
                path.display()
            )));
        }
        ember_train::io::require_regular_file(&path).map_err(|e| LlmError::io(&path, e))?;
        let inner = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        let mut t = Self {
            inner,
            chat_template: None,
            bos_token: None,
            eos_token: None,
            eos_ids: Vec::new(),
            template_kwargs: Default::default(),
        };
        let cfg_path = dir.join("tokenizer_config.json");
        if cfg_path.exists() {
            let text = ember_train::io::read_to_string(&cfg_path)
                .map_err(|e| LlmError::io(&cfg_path, e))?;
            let cfg: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| tok_err(format!("{}: {e}", cfg_path.display())))?;
            t.chat_template = named_template(cfg.get("chat_template"));
            let special = |k: &str| match cfg.get(k) {
                Some(serde_json::Value::String(s)) => Some(s.clone()),
                Some(v) => v
                    .get("content")
                    .and_then(|c| c.as_str())
                    .map(str::to_string),
                None => None,
            };
            t.bos_token = special("bos_token");
            t.eos_token = special("eos_token");
        }
        // transformers ≥ 4.43 saves the template as a file of its own, which wins over the
        // config's copy (`chat_template.jinja`, as `PreTrainedTokenizerBase.save_pretrained`).
        let jinja = dir.join("chat_template.jinja");
        if jinja.exists() {
            let text =
                ember_train::io::read_to_string(&jinja).map_err(|e| LlmError::io(&jinja, e))?;
            t.chat_template = Some(text);
        }
        if let Some(eos) = &t.eos_token {
            t.eos_ids.extend(t.inner.token_to_id(eos));
        }
        Ok(t)
    }

    /// Rebuilds the tokenizer stored in GGUF metadata (`tokenizer.ggml.*`): byte-level BPE
    /// (`model = gpt2`) with the pre-tokenizer named by `tokenizer.ggml.pre`.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let model = file.get("tokenizer.ggml.model")?.as_str().unwrap_or("");
        if model != "gpt2" {
            return Err(LlmError::Tokenizer(format!(
                "GGUF tokenizer model `{model}` is not supported (only byte-level BPE, `gpt2`)"
            )));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            Ok(file
                .get(key)?
                .as_array()
                .ok_or_else(|| tok_err(format!("{key} is not an array")))?
                .iter()
                .map(|v| v.as_str().unwrap_or("").to_string())
                .collect())
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<u64> = file
            .metadata
            .get("tokenizer.ggml.token_type")
            .and_then(Value::as_array)
            .map(|a| a.iter().map(|v| v.as_u64().unwrap_or(1)).collect())
            .unwrap_or_default();
        if types.len() > tokens.len() {
            return Err(tok_err(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens",
                types.len(),
                tokens.len()
            )));
        }
        let vocab: serde_json::Map<String, serde_json::Value> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), json!(i)))
            .collect();
        // Control (3) and user-defined (4) tokens are matched whole, never split.
        let added: Vec<serde_json::Value> = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == 3 || **t == 4)
            .map(|(i, t)| json!({"id": i, "content": tokens[i], "single_word": false, "lstrip": false, "rstrip": false, "normalized": *t == 4, "special": *t == 3}))
            .collect();
        let pre = file
            .metadata
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("default");
        let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let pre_tokenizer = match pre {
            "default" | "gpt2" | "gpt-2" => byte_level,
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level]}),
            "qwen2" | "deepseek-r1-qwen" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}),
            "llama-bpe" | "llama3" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]}),
            other => {
                return Err(LlmError::Tokenizer(format!(
                    "GGUF pre-tokenizer `{other}` is not supported (supported: gpt2, smollm, qwen2, llama-bpe)"
                )));
            }
        };
        let spec = json!({
            "version": "1.0",
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": null,
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vocab, "merges": merges},
        });
        let inner: tokenizers::Tokenizer = spec.to_string().parse().map_err(tok_err)?;
        let id = |k: &str| {
            file.metadata
                .get(k)
                .and_then(Value::as_u64)
                .map(|v| v as u32)
        };
        let name = |i: Option<u32>| i.and_then(|i| tokens.get(i as usize).cloned());
        let eos = id("tokenizer.ggml.eos_token_id");
        let mut eos_ids: Vec<u32> = eos.into_iter().collect();
        // The chat end-of-turn token also ends generation (llama.cpp's `eot`).
        if let Some(eot) = id("tokenizer.ggml.eot_token_id") {
            eos_ids.push(eot);
        }
        Ok(Self {
            inner,
            chat_template: file
                .metadata
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(str::to_string),
            bos_token: name(id("tokenizer.ggml.bos_token_id")),
            eos_token: name(eos),
            eos_ids,
            template_kwargs: Default::default(),
        })
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` (chat template, special tokens) into
    /// `dir`, so a model exported from GGUF is a complete Hugging Face directory; the chat
    /// template also as `chat_template.jinja`, where transformers 5 saves and looks for it first.
    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| LlmError::io(dir, e))?;
        let path = dir.join("tokenizer.json");
        let json = self
            .inner
            .to_string(false)
            .map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
        crate::files::write_atomic(&path, json.as_bytes())?;
        let mut cfg = serde_json::Map::new();
        cfg.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        if let Some(t) = &self.chat_template {
            cfg.insert("chat_template".into(), json!(t));
            crate::files::write_atomic(&dir.join("chat_template.jinja"), t.as_bytes())?;
        }
        if let Some(b) = &self.bos_token {
            cfg.insert("bos_token".into(), json!(b));
        }
        if let Some(e) = &self.eos_token {
            cfg.insert("eos_token".into(), json!(e));
        }
        let cfg_path = dir.join("tokenizer_config.json");
        let text =
            serde_json::to_string_pretty(&serde_json::Value::Object(cfg)).unwrap_or_default();
        crate::files::write_atomic(&cfg_path, text.as_bytes())
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token string.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Encodes text (special tokens in the text are recognised; no BOS is added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    /// Encodes text with the tokenizer's own special tokens added (its post-processor: a BOS
    /// for Llama's) when `add_special_tokens`, as transformers' `encode` does by default.
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, add_special_tokens)
            .map_err(tok_err)?
            .get_ids()
            .to_vec())
    }

    /// Decodes ids to text, dropping special tokens when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(tok_err)
    }

    /// Renders the chat template for `messages`, with the assistant turn opened when
    /// `add_generation_prompt`.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with(messages, add_generation_prompt, &Default::default())
    }

    /// [`apply_chat_template`](Self::apply_chat_template) with `extra` template variables over
    /// [`template_kwargs`](Self::template_kwargs) (a request's `chat_template_kwargs`).
    pub fn apply_chat_template_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut kwargs = self.template_kwargs.clone();
        kwargs.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| LlmError::Template("the model has no chat template".into()))?;
        render_chat_with(
            template,
            messages,
            add_generation_prompt,
            self.bos_token.as_deref(),
            self.eos_token.as_deref(),
            &kwargs,
        )
    }
}

/// The chat template of a `chat_template` value: a string, or the list form
/// `[{"name": "default", "template": ...}, {"name": "tool_use", ...}]` (its `default` entry).
fn named_template(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|e| e.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|e| e.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// transformers' `strftime_now(format)` for chat templates: the local time in a C `strftime`
/// format; a malformed format is an error, not a panic.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        let msg = format!("strftime_now: `{format}` is not a strftime format");
        return Err(minijinja::Error::new(
            minijinja::ErrorKind::InvalidOperation,
            msg,
        ));
    }
    Ok(chrono::Local::now()
        .format_with_items(items.into_iter())
        .to_string())
}

/// The most template instructions one rendering may run.
const TEMPLATE_FUEL: u64 = 5_000_000;

/// Renders a Hugging Face chat template with `minijinja` (Python string methods enabled).
pub fn render_chat(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String> {
    render_chat_with(
        template,
        messages,
        add_generation_prompt,
        bos_token,
        eos_token,
        &Default::default(),
    )
}

/// [`render_chat`] with extra template variables (`kwargs`; the standard ones win).
pub fn render_chat_with(
    template: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
    kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<String> {
    let mut env = minijinja::Environment::new();
    // A template comes from the model file: bounded work, so a hostile one (an endless loop)
    // is an error instead of a hang. Real chat templates use a few thousand instructions.
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_function("strftime_now", strftime_now);
    env.add_template("chat", template)
        .map_err(|e| LlmError::Template(e.to_string()))?;
    let t = env
        .get_template("chat")
        .map_err(|e| LlmError::Template(e.to_string()))?;
    let standard = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token.unwrap_or(""),
        eos_token => eos_token.unwrap_or(""),
    };
    let extra = minijinja::Value::from_serialize(kwargs);
    t.render(minijinja::context! { ..standard, ..extra })
        .map_err(|e| LlmError::Template(e.to_string()))
}
