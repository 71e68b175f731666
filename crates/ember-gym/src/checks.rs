//! The checks a candidate passes before it runs: its source (headers, inline assembly, the
//! preprocessor's ways around both), then its compiled object (`nm`, `objdump`): which symbols
//! it calls, which it defines, whether it keeps writable state, runs code at load time or holds
//! instructions that reach the kernel or the clock. Each failure is a named [`Verdict`].

use crate::verdict::Verdict;

/// Largest source accepted, in bytes.
pub const MAX_SOURCE: usize = 32 * 1024;

/// Headers a candidate may include.
const HEADERS: &[&str] = &[
    "math.h",
    "stddef.h",
    "stdint.h",
    "stdlib.h",
    "string.h",
    "float.h",
    "stdbool.h",
    "limits.h",
    "immintrin.h",
];

/// Functions a candidate may call beside its task's library routines: libm, the heap and the
/// memory routines compilers emit calls to.
const CALLS: &[&str] = &[
    "expf",
    "exp",
    "exp2f",
    "logf",
    "log",
    "log2f",
    "sqrtf",
    "sqrt",
    "tanhf",
    "tanh",
    "erff",
    "erf",
    "powf",
    "pow",
    "fabsf",
    "fabs",
    "fmaxf",
    "fminf",
    "fmax",
    "fmin",
    "floorf",
    "ceilf",
    "roundf",
    "sinf",
    "cosf",
    "fmaf",
    "fma",
    "memcpy",
    "memset",
    "memmove",
    "malloc",
    "calloc",
    "free",
    "aligned_alloc",
    "posix_memalign",
    "__stack_chk_fail",
    "_GLOBAL_OFFSET_TABLE_",
];

/// Names a candidate must not define beside [`TIMING`]'s: the harness's.
const PROTECTED: &[&str] = &[
    "now_ns", "printf", "puts", "exit", "abort", "qsort", "strtod", "strtoull", "atoi",
];

/// Calls that read or stop the clock, or work outside the kernel's call.
const TIMING: &[&str] = &[
    "clock_gettime",
    "clock",
    "time",
    "gettimeofday",
    "nanosleep",
    "usleep",
    "sleep",
    "sched_yield",
    "pthread_create",
    "thrd_create",
    "fork",
    "vfork",
    "clone",
    "execve",
    "system",
    "setitimer",
    "timer_create",
    "alarm",
    "signal",
    "sigaction",
    "raise",
    "kill",
];

/// Instructions that reach the kernel, read a clock or counter, or stop the core.
const INSTRUCTIONS: &[&str] = &[
    "syscall", "sysenter", "int ", "int3", "rdtsc", "rdtscp", "rdpmc", "hlt", "cpuid", "rdrand",
];

/// The source checks: size, headers, inline assembly and the preprocessor's escapes.
pub fn source(code: &str) -> Result<(), Verdict> {
    if code.len() > MAX_SOURCE {
        return Err(Verdict::Rejected(format!(
            "the source is {} bytes; at most {MAX_SOURCE}",
            code.len()
        )));
    }
    // Line splices first, as the preprocessor does, so `#inc\<newline>lude` is seen whole;
    // then comments become spaces, so `#/**/include` and `/* */ #include` read as directives.
    let joined = without_comments(&code.replace("\\\r\n", "").replace("\\\n", ""));
    for (n, line) in joined.lines().enumerate() {
        let t = line.trim_start();
        if t.starts_with("%:") || t.contains("??=") {
            return Err(Verdict::Rejected(format!(
                "line {}: digraph or trigraph directives are not accepted",
                n + 1
            )));
        }
        let Some(directive) = t.strip_prefix('#') else {
            continue;
        };
        let directive = directive.trim_start();
        if let Some(rest) = directive.strip_prefix("include") {
            let header = rest.trim();
            let name = header.trim_start_matches('<').trim_end_matches('>');
            if !header.starts_with('<') || !HEADERS.contains(&name) {
                return Err(Verdict::Rejected(format!(
                    "line {}: #include {header}: a kernel may include only <{}>",
                    n + 1,
                    HEADERS.join(">, <")
                )));
            }
        } else if ["embed", "line", "pragma push_macro"]
            .iter()
            .any(|d| directive.starts_with(d))
        {
            return Err(Verdict::Rejected(format!(
                "line {}: #{directive} is not accepted",
                n + 1
            )));
        }
    }
    for word in words(&joined) {
        if ["asm", "__asm", "__asm__", "_Pragma", "__has_include"].contains(&word) {
            return Err(Verdict::Rejected(format!("`{word}`: no inline assembly")));
        }
        let counter = ["__rdtsc", "__rdtscp", "_rdtsc", "__rdpmc", "_rdpmc"].contains(&word)
            || ["__builtin_ia32_rd", "_rdrand", "_rdseed", "_xbegin"]
                .iter()
                .any(|p| word.starts_with(p));
        if counter {
            return Err(Verdict::ForbiddenInstruction(word.to_string()));
        }
    }
    if joined.contains("##") {
        return Err(Verdict::Rejected(
            "`##`: token pasting could build a name the checks do not see".into(),
        ));
    }
    Ok(())
}

/// The identifiers of `code`.
fn words(code: &str) -> impl Iterator<Item = &str> {
    code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
}

/// One symbol of `nm -P`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Symbol {
    /// Name.
    pub name: String,
    /// `nm`'s type letter (`U` undefined, `T` global text, `t` local text, `B`/`b` bss, …).
    pub kind: char,
}

/// `nm -P`'s lines as symbols.
pub fn parse_nm(out: &str) -> Vec<Symbol> {
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            let kind = it.next()?.chars().next()?;
            Some(Symbol {
                name: name.to_string(),
                kind,
            })
        })
        .collect()
}

/// The object checks over its symbols, section headers (`objdump -h`) and disassembly
/// (`objdump -d`): what `entry` may call beside `library`, and what it may define.
pub fn object(
    symbols: &[Symbol],
    sections: &str,
    disassembly: &str,
    entry: &str,
    library: &[&str],
) -> Result<(), Verdict> {
    let defined = symbols.iter().any(|s| s.name == entry && s.kind == 'T');
    if !defined {
        return Err(Verdict::MissingEntry(entry.to_string()));
    }
    // Data the linker makes read-only after relocation (a table of function pointers) is not
    // state; any other non-empty data section is, whatever its name.
    let headers = section_headers(sections);
    let writable = headers.iter().any(|h| h.writable_data());
    for s in symbols {
        symbol(s, entry, library, writable)?;
    }
    for h in &headers {
        section(h)?;
    }
    for line in disassembly.lines() {
        // `objdump -d`: address, bytes and the instruction, separated by tabs.
        let Some(ins) = line.split('\t').nth(2) else {
            continue;
        };
        let ins = ins.trim();
        if let Some(bad) = INSTRUCTIONS
            .iter()
            .find(|i| ins == i.trim() || ins.starts_with(*i))
        {
            return Err(Verdict::ForbiddenInstruction(bad.trim().to_string()));
        }
    }
    Ok(())
}

/// One symbol: an allowed call, no harness or C library name, no state, no indirect function.
fn symbol(s: &Symbol, entry: &str, library: &[&str], writable: bool) -> Result<(), Verdict> {
    let name = s.name.as_str();
    if s.kind == 'U' {
        if name.starts_with("ref_") {
            return Err(Verdict::CallsReference(name.to_string()));
        }
        if TIMING.contains(&name) {
            return Err(Verdict::TouchesTiming(name.to_string()));
        }
        let vector_libm = name.starts_with("_ZGV");
        if !(CALLS.contains(&name) || library.contains(&name) || vector_libm) {
            return Err(Verdict::ForbiddenCall(name.to_string()));
        }
        return Ok(());
    }
    let reserved = PROTECTED.contains(&name)
        || TIMING.contains(&name)
        || CALLS.contains(&name)
        || library.contains(&name)
        || name.starts_with("ref_")
        || name.starts_with('_');
    if s.kind.is_ascii_uppercase() && name != entry && reserved {
        return Err(Verdict::Interposes(name.to_string()));
    }
    let relro = matches!(s.kind, 'D' | 'd') && !writable;
    let state = matches!(
        s.kind,
        'B' | 'b' | 'D' | 'd' | 'C' | 'G' | 'g' | 'S' | 's' | 'V'
    );
    if state && !relro {
        return Err(Verdict::KeepsState(name.to_string()));
    }
    if s.kind == 'i' {
        return Err(Verdict::RunsAtLoad(format!(
            "{name} (an indirect function)"
        )));
    }
    Ok(())
}

/// A section header of `objdump -h`: its name, whether it holds bytes, and its flags (the line
/// under it: `CONTENTS, ALLOC, LOAD, DATA`; empty where the listing has none).
struct Header<'a> {
    name: &'a str,
    nonempty: bool,
    flags: &'a str,
}

impl Header<'_> {
    /// Non-empty data the kernel can write: a section named as data (`.data`, `.bss`, `.tdata`,
    /// `.tbss`, not `.data.rel.ro`), or one of any other name allocated without `READONLY` or
    /// `CODE` (`__attribute__((section("cnt")))`).
    fn writable_data(&self) -> bool {
        let named = [".data", ".bss", ".tdata", ".tbss"]
            .iter()
            .any(|p| self.name.starts_with(p));
        let relro = self.name.starts_with(".data.rel.ro");
        let flagged = !self.name.starts_with('.')
            && (self.flags.is_empty()
                || (self.flags.contains("ALLOC")
                    && !self.flags.contains("READONLY")
                    && !self.flags.contains("CODE")));
        self.nonempty && !relro && (named || flagged)
    }
}

/// The section headers of an `objdump -h` listing, each with the flags line under it.
fn section_headers(listing: &str) -> Vec<Header<'_>> {
    let mut out: Vec<Header<'_>> = Vec::new();
    for line in listing.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let header = f.first().is_some_and(|i| i.parse::<u32>().is_ok()) && f.len() >= 3;
        match (header, out.last_mut()) {
            (true, _) => out.push(Header {
                name: f[1],
                nonempty: u64::from_str_radix(f[2], 16).is_ok_and(|n| n > 0),
                flags: "",
            }),
            (false, Some(last)) if last.flags.is_empty() && flags_line(line) => {
                last.flags = line.trim();
            }
            _ => {}
        }
    }
    out
}

/// A line of section flags: capitals, underscores, commas and spaces (`CONTENTS, ALLOC, LOAD`).
fn flags_line(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty()
        && t.chars()
            .all(|c| c.is_ascii_uppercase() || matches!(c, ',' | ' ' | '_'))
}

/// One section: no load-time code, no non-empty writable data, no section of its own.
fn section(h: &Header<'_>) -> Result<(), Verdict> {
    let name = h.name;
    let at_load = [".init", ".fini", ".ctors", ".dtors", ".preinit_array"];
    if at_load.iter().any(|s| name.starts_with(s)) {
        return Err(Verdict::RunsAtLoad(name.to_string()));
    }
    if h.writable_data() {
        return Err(Verdict::KeepsState(name.to_string()));
    }
    let known = SECTIONS
        .iter()
        .any(|s| name == *s || name.starts_with(&format!("{s}.")));
    if name.starts_with('.') && !known {
        return Err(Verdict::Rejected(format!("a section of its own: {name}")));
    }
    Ok(())
}

/// `code` with each comment replaced by a space (strings and characters kept as they are).
fn without_comments(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut chars = code.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        out.push(c);
        match (quote, c) {
            (Some(_), '\\') => out.extend(chars.next()),
            (Some(q), _) if c == q || c == '\n' => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '/') if chars.peek() == Some(&'/') => {
                out.pop();
                while chars.next_if(|n| *n != '\n').is_some() {}
                out.push(' ');
            }
            (None, '/') if chars.peek() == Some(&'*') => {
                out.pop();
                chars.next();
                let mut prev = ' ';
                for n in chars.by_ref() {
                    if prev == '*' && n == '/' {
                        break;
                    }
                    if n == '\n' {
                        out.push('\n');
                    }
                    prev = n;
                }
                out.push(' ');
            }
            _ => {}
        }
    }
    out
}

/// The dependencies `cc -M` printed are the compiler's own headers: no file outside the
/// system include directories, whatever the source's spelling of its `#include`.
pub fn dependencies(make_rule: &str) -> Result<(), Verdict> {
    let deps = make_rule
        .split_whitespace()
        .skip(1)
        .filter(|d| *d != "\\" && *d != "kernel.c");
    for d in deps {
        let system = [
            "/usr/include/",
            "/usr/lib/gcc/",
            "/usr/local/include/",
            "/usr/lib/llvm",
        ]
        .iter()
        .any(|p| d.starts_with(p));
        if !system || d.contains("..") || !d.ends_with(".h") {
            return Err(Verdict::Rejected(format!(
                "the source reads {d:?}: a kernel may include only standard headers"
            )));
        }
    }
    Ok(())
}

/// Sections a compiled kernel may have (the rest: writable or executable places of its own).
const SECTIONS: &[&str] = &[
    ".text",
    ".rodata",
    ".comment",
    ".note",
    ".eh_frame",
    ".data",
    ".bss",
    ".group",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_with_escapes_are_rejected() {
        assert!(source("#include <math.h>\nvoid f(void) {}\n").is_ok());
        for bad in [
            "#include \"/etc/passwd\"\n",
            "#include <stdio.h>\n",
            "#inc\\\nlude <stdio.h>\n",
            "%:include <stdio.h>\n",
            "void f(void) { __asm__(\"rdtsc\"); }\n",
            "#define A(x) x##sm\n",
            "_Pragma(\"GCC x\")\n",
            "#embed \"/etc/passwd\"\n",
            "#/**/include \"/etc/hostname\"\n",
            "/* x */ #include \"/etc/passwd\"\n",
        ] {
            assert!(
                matches!(source(bad), Err(Verdict::Rejected(_))),
                "{bad:?} was accepted"
            );
        }
        assert!(source(&"x".repeat(MAX_SOURCE + 1)).is_err());
    }

    #[test]
    fn objects_are_screened_by_symbol_section_and_instruction() {
        let nm = |s: &str| parse_nm(s);
        let ok = nm("vec_add T 0 10\nexpf U\nhelper t 10 5\n");
        assert_eq!(object(&ok, "", "", "vec_add", &[]), Ok(()));
        let cases = [
            (
                "vec_add T 0 1\nref_vec_add U\n",
                Verdict::CallsReference("ref_vec_add".into()),
            ),
            (
                "vec_add T 0 1\nfopen U\n",
                Verdict::ForbiddenCall("fopen".into()),
            ),
            (
                "vec_add T 0 1\nusleep U\n",
                Verdict::TouchesTiming("usleep".into()),
            ),
            (
                "vec_add T 0 1\nclock_gettime T 1 1\n",
                Verdict::Interposes("clock_gettime".into()),
            ),
            (
                "vec_add T 0 1\ncache b 0 4\n",
                Verdict::KeepsState("cache".into()),
            ),
            ("other T 0 1\n", Verdict::MissingEntry("vec_add".into())),
        ];
        for (syms, want) in cases {
            assert_eq!(
                object(&nm(syms), "", "", "vec_add", &[]),
                Err(want),
                "{syms}"
            );
        }
        let lib = nm("f T 0 1\nlib_matmul U\n");
        assert_eq!(object(&lib, "", "", "f", &["lib_matmul"]), Ok(()));
        // State in a section whose name lacks the leading dot is state all the same, named as
        // such; a read-only one of that kind is a section of its own.
        let custom = "Idx Name Size VMA LMA File off Algn\n  0 .text 00000013 0 0 40 2**4\n                  CONTENTS, ALLOC, LOAD, READONLY, CODE\n  1 cnt 00000004 0 0 54 2**2\n                  CONTENTS, ALLOC, LOAD, DATA\n";
        assert_eq!(
            object(&ok, custom, "", "vec_add", &[]),
            Err(Verdict::KeepsState("cnt".into()))
        );
        let counter = nm("vec_add T 0 10\ncalls d 0 4\n");
        assert_eq!(
            object(&counter, custom, "", "vec_add", &[]),
            Err(Verdict::KeepsState("calls".into()))
        );
        let constant = "  0 tbl 00000004 0 0 54 2**2\n                  CONTENTS, ALLOC, LOAD, READONLY, DATA\n";
        assert_eq!(object(&ok, constant, "", "vec_add", &[]), Ok(()));
        let sections = "  1 .init_array 00000008 0 0 0 2**3\n";
        assert_eq!(
            object(&ok, sections, "", "vec_add", &[]),
            Err(Verdict::RunsAtLoad(".init_array".into()))
        );
        let bss = "  2 .bss 00000010 0 0 0 2**2\n";
        assert_eq!(
            object(&ok, bss, "", "vec_add", &[]),
            Err(Verdict::KeepsState(".bss".into()))
        );
        let relro = "  3 .data.rel.ro.local 00000010 0 0 0 2**3\n";
        let table = nm("vec_add T 0 1\nOPS d 0 16\n");
        assert_eq!(object(&table, relro, "", "vec_add", &[]), Ok(()));
        let rel = "  3 .data.rel 00000010 0 0 0 2**3\n";
        assert!(object(&table, rel, "", "vec_add", &[]).is_err());
        let got = "  3 .got.plt 00000010 0 0 0 2**3\n";
        assert_eq!(
            object(&ok, got, "", "vec_add", &[]),
            Err(Verdict::Rejected("a section of its own: .got.plt".into()))
        );
        let ifunc = nm("vec_add T 0 1\nfast i 0 1\n");
        assert!(matches!(
            object(&ifunc, "", "", "vec_add", &[]),
            Err(Verdict::RunsAtLoad(_))
        ));
        let rule = "kernel.o: kernel.c /usr/include/math.h \\\n /usr/lib/gcc/x/12/include/stddef.h";
        assert!(dependencies(rule).is_ok());
        assert!(dependencies("kernel.o: kernel.c /etc/hostname").is_err());
        assert!(dependencies("kernel.o: kernel.c /usr/include/../../etc/passwd.h").is_err());
        assert_eq!(
            without_comments("a /* b\n c */ d // e\n\"/*\" '\\''"),
            "a \n  d  \n\"/*\" '\\''"
        );
        let dis = "   4:\t0f 31                \trdtsc\n";
        assert_eq!(
            object(&ok, "", dis, "vec_add", &[]),
            Err(Verdict::ForbiddenInstruction("rdtsc".into()))
        );
    }
}
