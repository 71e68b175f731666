//! `ember generate` and `ember export`: try a checkpoint in one command.

use anyhow::{Context, Result, bail};
use ember::tokenizer_for;
use ember_llm::{Message, SamplingConfig, generate, load, load_peft};
use std::path::{Path, PathBuf};

/// Parsed `--flag value` options.
pub struct Opts {
    args: Vec<(String, Option<String>)>,
}

impl Opts {
    /// Splits `--name value` pairs; `switches` take no value.
    pub fn parse(args: &[String], valued: &[&str], switches: &[&str]) -> Result<Self> {
        let mut out = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let name = a
                .strip_prefix("--")
                .with_context(|| format!("unexpected argument `{a}`"))?;
            if switches.contains(&name) {
                out.push((name.to_string(), None));
            } else if valued.contains(&name) {
                let v = it
                    .next()
                    .with_context(|| format!("--{name} needs a value"))?;
                out.push((name.to_string(), Some(v.clone())));
            } else {
                let mut all: Vec<String> = valued
                    .iter()
                    .chain(switches)
                    .map(|s| format!("--{s}"))
                    .collect();
                all.sort();
                bail!("unknown option `{a}` (valid: {})", all.join(", "));
            }
        }
        Ok(Self { args: out })
    }

    /// The value of `--name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.args
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Whether switch `--name` was given.
    pub fn flag(&self, name: &str) -> bool {
        self.args.iter().any(|(n, _)| n == name)
    }

    /// `--name` parsed as `T`, or `default`.
    pub fn num<T: std::str::FromStr>(&self, name: &str, default: T) -> Result<T> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| anyhow::anyhow!("--{name}: `{v}` is not a valid number")),
        }
    }
}

/// `ember generate`.
pub fn generate_cmd(args: &[String]) -> Result<()> {
    let o = Opts::parse(
        args,
        &[
            "model",
            "prompt",
            "max-new-tokens",
            "temperature",
            "top-k",
            "top-p",
            "min-p",
            "seed",
            "adapter",
            "device",
            "n",
        ],
        &["chat"],
    )?;
    let model_path = PathBuf::from(
        o.get("model")
            .context("--model <dir-or-.gguf> is required")?,
    );
    let prompt = o.get("prompt").context("--prompt <text> is required")?;
    let device = ember::device::device(o.get("device").unwrap_or("auto"))?;
    let tok = tokenizer_for(&model_path)?;
    let mut loaded =
        load(&model_path, &device).with_context(|| format!("loading {}", model_path.display()))?;
    if let Some(a) = o.get("adapter") {
        loaded.model = load_peft(loaded.model, Path::new(a), &device)?.0;
    }
    let text = if o.flag("chat") {
        tok.apply_chat_template(&[Message::new("user", prompt)], true)?
    } else {
        prompt.to_string()
    };
    let ids = tok.encode(&text)?;
    let mut stop = loaded.eos_ids.clone();
    stop.extend(tok.eos_ids.iter().copied());
    stop.sort_unstable();
    stop.dedup();
    let cfg = SamplingConfig {
        temperature: o.num("temperature", 0.0)?,
        top_k: o.num("top-k", 0)?,
        top_p: o.num("top-p", 1.0)?,
        min_p: o.num("min-p", 0.0)?,
        max_new_tokens: o.num("max-new-tokens", 64)?,
        seed: o.num("seed", 0)?,
        n: o.num("n", 1)?,
        stop_tokens: stop,
        ..SamplingConfig::default()
    };
    let start = std::time::Instant::now();
    let g = generate(&loaded.model, &[ids], &cfg, &device)?;
    let secs = start.elapsed().as_secs_f64();
    let responses = g.response_ids();
    let new: usize = responses.iter().map(Vec::len).sum();
    for (i, r) in responses.iter().enumerate() {
        if responses.len() > 1 {
            println!("--- sample {i}");
        }
        println!("{}", tok.decode(r, true)?);
    }
    eprintln!(
        "{new} tokens in {secs:.2} s ({:.1} tokens/s)",
        new as f64 / secs
    );
    Ok(())
}

/// `ember export`: a checkpoint (plus an optional adapter, merged) to Hugging Face safetensors.
pub fn export_cmd(args: &[String]) -> Result<()> {
    let o = Opts::parse(args, &["model", "adapter", "out"], &[])?;
    let model_path = PathBuf::from(
        o.get("model")
            .context("--model <dir-or-.gguf> is required")?,
    );
    let out = PathBuf::from(o.get("out").context("--out <dir> is required")?);
    let device = burn::tensor::Device::default();
    let mut loaded = load(&model_path, &device)?;
    if let Some(a) = o.get("adapter") {
        loaded.model = ember_llm::merge(load_peft(loaded.model, Path::new(a), &device)?.0);
    }
    ember_llm::save_hf(&loaded.model, &loaded.config, &loaded.eos_ids, &out)?;
    if let Ok(tok) = tokenizer_for(&model_path) {
        tok.save(&out)?;
    }
    println!("wrote {}", out.display());
    Ok(())
}
