//! A character-level tokenizer for the procedurally generated tasks of the CPU recipe.

/// Token ids: 0 `<pad>`, 1 `<bos>`, 2 `<eos>`, then one per character of [`CHARS`].
pub const CHARS: &str = "0123456789+-*=., ";

/// Beginning of sequence (id 0 is padding).
pub const BOS: u32 = 1;
/// End of sequence (ends a response).
pub const EOS: u32 = 2;

/// Vocabulary size.
pub fn vocab_size() -> usize {
    3 + CHARS.chars().count()
}

/// Encodes `text`, failing on a character outside the vocabulary.
pub fn encode(text: &str) -> Result<Vec<u32>, String> {
    text.chars()
        .map(|c| {
            CHARS
                .chars()
                .position(|x| x == c)
                .map(|p| p as u32 + 3)
                .ok_or_else(|| format!("character {c:?} is not in the vocabulary {CHARS:?}"))
        })
        .collect()
}

/// Decodes ids, dropping special tokens.
pub fn decode(ids: &[u32]) -> String {
    let chars: Vec<char> = CHARS.chars().collect();
    ids.iter()
        .filter(|i| **i >= 3)
        .filter_map(|i| chars.get(*i as usize - 3))
        .collect()
}

/// The vocabulary as a Hugging Face `tokenizers` file (`tokenizer.json`): a word-level model
/// over single characters (every character split off by the pre-tokenizer, the pieces fused
/// back when decoding), `<pad>`, `<bos>` and `<eos>` as special tokens, an unknown character
/// read as `<pad>`. With [`hf_tokenizer_config`] it makes an exported tiny model a complete
/// Hugging Face directory (`ember serve`, `ember generate`, `transformers`).
pub fn hf_tokenizer_json() -> serde_json::Value {
    let special = ["<pad>", "<bos>", "<eos>"];
    let mut vocab = serde_json::Map::new();
    for (i, s) in special.iter().enumerate() {
        vocab.insert((*s).to_string(), i.into());
    }
    for (i, c) in CHARS.chars().enumerate() {
        vocab.insert(c.to_string(), (i + 3).into());
    }
    let added: Vec<serde_json::Value> = special
        .iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::json!({"id": i, "content": s, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(?s)."},
            "behavior": "Isolated", "invert": false},
        "post_processor": null,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<pad>"},
    })
}

/// `tokenizer_config.json` of [`hf_tokenizer_json`]: the special tokens by name.
pub fn hf_tokenizer_config() -> serde_json::Value {
    serde_json::json!({
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<pad>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    })
}

/// Writes [`hf_tokenizer_json`] and [`hf_tokenizer_config`] into `dir`.
pub fn write_hf_tokenizer(dir: &std::path::Path) -> std::io::Result<()> {
    for (name, v) in [
        ("tokenizer.json", hf_tokenizer_json()),
        ("tokenizer_config.json", hf_tokenizer_config()),
    ] {
        let text = serde_json::to_string_pretty(&v).map_err(std::io::Error::other)?;
        ember_train::io::write_atomic(&dir.join(name), text.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Hugging Face file encodes and decodes as this module does, through the `tokenizers`
    /// crate that `ember serve` reads it with.
    #[test]
    fn hf_tokenizer_matches_the_character_vocabulary() {
        let dir = std::env::temp_dir().join(format!("ember-chartok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_hf_tokenizer(&dir).unwrap();
        let tok = crate::Tokenizer::from_hf_dir(&dir).unwrap();
        let text = "12+34=46, 7*8 = -1.5";
        assert_eq!(tok.encode(text).unwrap(), encode(text).unwrap());
        let mut ids = vec![BOS];
        ids.extend(encode(text).unwrap());
        ids.push(EOS);
        assert_eq!(tok.decode(&ids, true).unwrap(), decode(&ids));
        assert_eq!(tok.eos_ids, vec![EOS]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
