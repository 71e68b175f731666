//! The C code of a model's answer: the last fenced block tagged `c` (or untagged, or `cpp`), or
//! the whole answer when it has no fence but defines the task's function. A block the token
//! budget cut off keeps what precedes its last complete top-level definition (the brace depth
//! back at 0), so a kernel followed by an unfinished test driver still compiles.

/// The code in `answer`, or `None`.
pub fn code(answer: &str, entry: &str) -> Option<String> {
    let mut blocks: Vec<(String, String)> = Vec::new();
    let mut rest = answer;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let tag_end = after.find('\n').unwrap_or(after.len());
        let tag = after[..tag_end].trim().to_ascii_lowercase();
        let body = &after[(tag_end + 1).min(after.len())..];
        let (inner, next) = match body.find("```") {
            Some(close) => (&body[..close], &body[close + 3..]),
            // An answer cut off by the token budget: the open block's complete definitions.
            None => (complete_prefix(body), ""),
        };
        blocks.push((tag, inner.to_string()));
        rest = next;
    }
    let c_like = |t: &str| matches!(t, "" | "c" | "cpp" | "c++" | "h");
    let chosen = blocks
        .iter()
        .rev()
        .find(|(t, b)| c_like(t) && b.contains(entry))
        .or_else(|| blocks.iter().rev().find(|(t, _)| c_like(t)))
        .map(|(_, b)| b.clone());
    chosen
        .or_else(|| {
            answer
                .contains(&format!("{entry}("))
                .then(|| answer.to_string())
        })
        .map(|c| without_main(&c))
        .filter(|c| !c.trim().is_empty())
}

/// `code` without a top-level `main` function (a test driver models often add; the harness has
/// its own): from the line that opens it to its closing brace, or to the end.
fn without_main(code: &str) -> String {
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        let t = line.trim_start();
        let opens = ["int main", "void main", "int\tmain"]
            .iter()
            .any(|p| t.starts_with(p) && t[p.len()..].trim_start().starts_with('('));
        if opens && !line.starts_with([' ', '\t']) {
            let rest = &code[at..];
            let end = closing(rest, true).unwrap_or(rest.len());
            return format!("{}{}", &code[..at], &rest[end..]);
        }
        at += line.len();
    }
    code.to_string()
}

/// `code` up to the end of its last line where the brace depth returns to 0 (ignoring braces in
/// strings, characters and comments), or all of it when no brace closes.
fn complete_prefix(code: &str) -> &str {
    closing(code, false).map_or(code, |e| &code[..e])
}

/// The end of the line of the first (or last) brace that brings the depth back to 0.
fn closing(code: &str, first: bool) -> Option<usize> {
    let (mut depth, mut end) = (0i64, None);
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                i = code[i..].find('\n').map_or(bytes.len(), |n| i + n);
                continue;
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i = code[i + 2..].find("*/").map_or(bytes.len(), |n| i + n + 4);
                continue;
            }
            q @ (b'"' | b'\'') => {
                i += 1;
                while i < bytes.len() && bytes[i] != q && bytes[i] != b'\n' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
            }
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    end = Some(code[i..].find('\n').map_or(bytes.len(), |n| i + n + 1));
                    if first {
                        return end;
                    }
                }
            }
            _ => {}
        }
        i += 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::code;

    #[test]
    fn the_last_c_block_naming_the_function_is_taken() {
        let a = "Here:\n```c\nint x;\n```\nand\n```c\nvoid f(int n) {}\n```\nDone.";
        assert_eq!(code(a, "f").as_deref(), Some("void f(int n) {}\n"));
        assert_eq!(code("```python\nprint(1)\n```", "f"), None);
        assert_eq!(code("no code", "f"), None);
        assert_eq!(code("```c\nvoid f(", "f").as_deref(), Some("void f("));
        let with_main = "```c\nvoid f(int n) {}\nint main() {\n    f(1);\n    printf(\"{}\");\n}\nvoid g(void) {}\n```";
        assert_eq!(
            code(with_main, "f").as_deref(),
            Some("void f(int n) {}\nvoid g(void) {}\n")
        );
        let cut =
            "```c\nvoid f(int n) { if (n) { n--; } /* } */ }\nint main() {\n    int x = '}';\n";
        assert_eq!(
            code(cut, "f").as_deref(),
            Some("void f(int n) { if (n) { n--; } /* } */ }\n")
        );
        assert_eq!(
            code("void f(int n) {}", "f").as_deref(),
            Some("void f(int n) {}")
        );
    }
}
