//! `ember generate` and `ember export`: try a checkpoint in one command.

use anyhow::{Context, Result};
use ember_llm::Tokenizer;
use ember_llm::{Message, SamplingConfig, generate, load, load_peft};
use std::path::PathBuf;

/// `ember generate` options.
#[derive(clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory, a .gguf file, or a Hub id (`ORG/NAME[@REVISION]`, a file
    /// inside it as `ORG/NAME/FILE`) found in the local Hugging Face cache.
    #[arg(long)]
    model: PathBuf,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt in the tokenizer's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// Softmax temperature (0 = greedy).
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens below this fraction of the most likely one's probability.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Samples of the prompt.
    #[arg(long, default_value_t = 1)]
    n: usize,
    /// A PEFT LoRA adapter directory applied on top of the model.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// cpu, cuda, wgpu or auto.
    #[arg(long, default_value = "auto")]
    device: String,
}

/// `ember export` options.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// A Hugging Face model directory, a .gguf file, or a Hub id (`ORG/NAME[@REVISION]`, a file
    /// inside it as `ORG/NAME/FILE`) found in the local Hugging Face cache.
    #[arg(long)]
    model: PathBuf,
    /// A PEFT LoRA adapter directory, merged into the weights.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// The output directory.
    #[arg(long)]
    out: PathBuf,
}

/// `ember generate`.
pub fn generate_cmd(o: GenerateArgs) -> Result<()> {
    let model_path = ember_hub::resolve(&o.model)?;
    let prompt = o.prompt.as_str();
    let device = ember::common::device::device(&o.device)?;
    let tok = Tokenizer::for_checkpoint(&model_path)?;
    let mut loaded =
        load(&model_path, &device).with_context(|| format!("loading {}", model_path.display()))?;
    if let Some(a) = &o.adapter {
        loaded.model = load_peft(loaded.model, a, &device)?.0;
    }
    let text = if o.chat {
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
        temperature: o.temperature,
        top_k: o.top_k,
        top_p: o.top_p,
        min_p: o.min_p,
        max_new_tokens: o.max_new_tokens,
        seed: o.seed,
        n: o.n,
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
pub fn export_cmd(o: ExportArgs) -> Result<()> {
    let (model_path, out) = (ember_hub::resolve(&o.model)?, o.out);
    let device = burn::tensor::Device::default();
    let mut loaded = load(&model_path, &device)?;
    if let Some(a) = &o.adapter {
        loaded.model = ember_llm::merge(load_peft(loaded.model, a, &device)?.0);
    }
    ember_llm::save_hf(&loaded.model, &loaded.config, &loaded.eos_ids, &out)?;
    if let Ok(tok) = Tokenizer::for_checkpoint(&model_path) {
        tok.save(&out)?;
    }
    println!("wrote {}", out.display());
    Ok(())
}
