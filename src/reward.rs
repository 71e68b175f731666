//! Verifiable rewards: answer extraction and numeric exact match.

/// The final answer in a completion, tried in order: the last `\boxed{…}`, the last
/// `<answer>…</answer>`, the text after the last "answer:" / "answer is", else the last number.
pub fn extract_answer(text: &str) -> Option<String> {
    if let Some(i) = text.rfind("\\boxed{") {
        let rest = &text[i + 7..];
        let mut depth = 1usize;
        for (j, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(rest[..j].trim().to_string());
                    }
                }
                _ => {}
            }
        }
    }
    if let (Some(a), Some(b)) = (text.rfind("<answer>"), text.rfind("</answer>"))
        && a + 8 <= b
    {
        return Some(text[a + 8..b].trim().to_string());
    }
    let lower = text.to_lowercase();
    for marker in ["answer:", "answer is"] {
        if let Some(i) = lower.rfind(marker) {
            let tail = &text[i + marker.len()..];
            if let Some(n) = last_number(tail.lines().next().unwrap_or("")) {
                return Some(n);
            }
        }
    }
    last_number(text)
}

/// The last number in `text` (optional sign, digits, thousands commas, decimals).
pub fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut end = chars.len();
    while end > 0 {
        if chars[end - 1].is_ascii_digit() {
            let mut start = end;
            while start > 0
                && (chars[start - 1].is_ascii_digit()
                    || chars[start - 1] == '.'
                    || chars[start - 1] == ',')
            {
                start -= 1;
            }
            while start < end && !chars[start].is_ascii_digit() {
                start += 1;
            }
            if start > 0 && chars[start - 1] == '-' {
                start -= 1;
            }
            return Some(chars[start..end].iter().filter(|c| **c != ',').collect());
        }
        end -= 1;
    }
    None
}

/// Parses a numeric answer (commas, `$`, `%` and surrounding spaces ignored).
pub fn parse_number(s: &str) -> Option<f64> {
    let cleaned: String = s
        .chars()
        .filter(|c| !matches!(c, ',' | '$' | '%' | ' '))
        .collect();
    cleaned.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// 1 when the completion's extracted answer equals `answer` numerically (or textually when
/// either is not a number), else 0.
pub fn exact_match(completion: &str, answer: &str) -> f32 {
    let Some(got) = extract_answer(completion) else {
        return 0.0;
    };
    match (parse_number(&got), parse_number(answer)) {
        (Some(a), Some(b)) => f32::from((a - b).abs() <= 1e-6 * b.abs().max(1.0)),
        _ => f32::from(got.trim() == answer.trim()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extraction_order_and_numbers() {
        assert_eq!(
            extract_answer("so \\boxed{\\frac{1}{2}} done").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(
            extract_answer("x <answer> 42 </answer> y 7").as_deref(),
            Some("42")
        );
        assert_eq!(
            extract_answer("The answer is 1,234.\nThen 9").as_deref(),
            Some("1234")
        );
        assert_eq!(extract_answer("first 3 then -17").as_deref(), Some("-17"));
        assert_eq!(extract_answer("no digits"), None);
        assert_eq!(exact_match("46", "46"), 1.0);
        assert_eq!(exact_match("answer: 46.0", "46"), 1.0);
        assert_eq!(exact_match("#### 1,000", "1000"), 1.0);
        assert_eq!(exact_match("45", "46"), 0.0);
        assert_eq!(exact_match("", "46"), 0.0);
    }
}
