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
