//! The tiny policy's vocabularies: the characters of the procedurally generated tasks of the
//! CPU recipe ([`CHARS`]), or every byte ([`Vocab::Bytes`]: any text, any environment).

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
    let mut vocab = special_vocab();
    for (i, c) in CHARS.chars().enumerate() {
        vocab.insert(c.to_string(), (i + 3).into());
    }
    tokenizer_file(
        serde_json::json!({"type": "Split", "pattern": {"Regex": "(?s)."},
            "behavior": "Isolated", "invert": false}),
        serde_json::json!({"type": "Fuse"}),
        serde_json::json!({"type": "WordLevel", "vocab": vocab, "unk_token": "<pad>"}),
    )
}

/// The special tokens, ids 0 to 2.
const SPECIAL: [&str; 3] = ["<pad>", "<bos>", "<eos>"];

/// A vocabulary holding the special tokens.
fn special_vocab() -> serde_json::Map<String, serde_json::Value> {
    SPECIAL
        .iter()
        .enumerate()
        .map(|(i, s)| ((*s).to_string(), i.into()))
        .collect()
}

/// A `tokenizer.json` with the special tokens added, around a pre-tokenizer, decoder and model.
fn tokenizer_file(
    pre: serde_json::Value,
    decoder: serde_json::Value,
    model: serde_json::Value,
) -> serde_json::Value {
    let added: Vec<serde_json::Value> = SPECIAL
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
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": decoder,
        "model": model,
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

/// A tiny policy's vocabulary. Both put `<pad>`, `<bos>`, `<eos>` at 0, 1, 2.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vocab {
    /// [`CHARS`]: the arithmetic tasks' characters.
    #[default]
    Chars,
    /// The 256 byte values (UTF-8 text of any language, any symbol): id 3 + byte.
    Bytes,
}

impl Vocab {
    /// Vocabulary size (specials included).
    pub fn size(self) -> usize {
        match self {
            Self::Chars => vocab_size(),
            Self::Bytes => 3 + 256,
        }
    }

    /// Encodes `text` (bytes: never fails).
    pub fn encode(self, text: &str) -> Result<Vec<u32>, String> {
        match self {
            Self::Chars => encode(text),
            Self::Bytes => Ok(text.bytes().map(|b| u32::from(b) + 3).collect()),
        }
    }

    /// Decodes ids, dropping special tokens (bytes: invalid UTF-8 becomes U+FFFD).
    pub fn decode(self, ids: &[u32]) -> String {
        match self {
            Self::Chars => decode(ids),
            Self::Bytes => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter_map(|&i| u8::try_from(i.checked_sub(3)?).ok())
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
        }
    }

    /// The vocabulary as a Hugging Face `tokenizer.json` (see [`hf_tokenizer_json`]; bytes: a
    /// byte-level BPE without merges, GPT-2's byte-to-character table).
    pub fn hf_tokenizer_json(self) -> serde_json::Value {
        match self {
            Self::Chars => hf_tokenizer_json(),
            Self::Bytes => byte_level_json(),
        }
    }

    /// Writes the vocabulary's `tokenizer.json` and `tokenizer_config.json` into `dir`.
    pub fn write_hf_tokenizer(self, dir: &std::path::Path) -> std::io::Result<()> {
        for (name, v) in [
            ("tokenizer.json", self.hf_tokenizer_json()),
            ("tokenizer_config.json", hf_tokenizer_config()),
        ] {
            let text = serde_json::to_string_pretty(&v).map_err(std::io::Error::other)?;
            ember_train::io::write_atomic(&dir.join(name), text.as_bytes())?;
        }
        Ok(())
    }
}

/// GPT-2's byte-to-character table (`bytes_to_unicode` of its `encoder.py`): printable bytes
/// stand for themselves, the others for 256 + their rank among them.
fn byte_char(b: u8) -> char {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

fn byte_level_json() -> serde_json::Value {
    let mut vocab = special_vocab();
    for b in 0..=255u8 {
        vocab.insert(byte_char(b).to_string(), (u32::from(b) + 3).into());
    }
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false,
        "trim_offsets": false, "use_regex": false});
    tokenizer_file(
        byte_level.clone(),
        byte_level,
        serde_json::json!({"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []}),
    )
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

    /// Bytes: any text round-trips, ids are 3 + byte, and the Hugging Face file (a byte-level
    /// BPE without merges) encodes and decodes the same through the `tokenizers` crate.
    #[test]
    fn byte_vocabulary_takes_any_text() {
        let v = Vocab::Bytes;
        let text = "Größe: ∑x² ≤ 10 🔥\n\tok";
        let ids = v.encode(text).unwrap();
        assert_eq!(ids.len(), text.len());
        assert_eq!(v.encode("A").unwrap(), vec![65 + 3]);
        assert_eq!(v.decode(&[BOS, 65 + 3, 66 + 3, EOS]), "AB");
        assert_eq!(v.decode(&ids), text);
        assert_eq!(v.size(), 259);
        let dir = std::env::temp_dir().join(format!("ember-bytetok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        v.write_hf_tokenizer(&dir).unwrap();
        let tok = crate::Tokenizer::from_hf_dir(&dir).unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids);
        assert_eq!(tok.decode(&ids, true).unwrap(), text);
        assert_eq!(tok.vocab_size(), 259);
        std::fs::remove_dir_all(&dir).ok();
        // GPT-2's table: a bijection onto 256 characters.
        let chars: std::collections::BTreeSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!((byte_char(b' '), byte_char(0)), ('Ġ', 'Ā'));
    }
}
