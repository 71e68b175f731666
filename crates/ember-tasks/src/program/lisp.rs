//! The symbolic "computer" of Neural Symbolic Machines (Liang et al., ACL 2017): a small
//! Lisp over a knowledge base whose expressions `( f v x )` store their result in a fresh
//! variable, and which names, before each token, the tokens that keep the program valid (the
//! paper's code assistance: syntax, the types of the arguments, and a non-empty result).

use super::kb::Kb;
use std::fmt;

/// A value held in a variable: a set of entities (ids, sorted, distinct) or a number.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Value {
    /// Entities.
    Set(Vec<usize>),
    /// A count.
    Num(i64),
}

/// The functions of the language (NSM's `Hop`, `ArgMax`, `ArgMin`, `Count`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Func {
    /// `( hop v r )`: the entities reached from `v`'s through relation `r`.
    Hop,
    /// `( argmax v a )`: the entities of `v` with the largest attribute `a`.
    ArgMax,
    /// `( argmin v a )`: the entities of `v` with the smallest attribute `a`.
    ArgMin,
    /// `( count v )`: how many entities `v` holds.
    Count,
}

const FUNCS: [Func; 4] = [Func::Hop, Func::ArgMax, Func::ArgMin, Func::Count];

impl Func {
    fn name(self) -> &'static str {
        match self {
            Func::Hop => "hop",
            Func::ArgMax => "argmax",
            Func::ArgMin => "argmin",
            Func::Count => "count",
        }
    }
}

/// One token of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Word {
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// Ends the program: its answer is the last variable.
    Return,
    /// A function.
    Func(Func),
    /// Variable `v<i>`.
    Var(usize),
    /// A relation of the knowledge base (its index).
    Rel(usize),
    /// A numeric attribute of the knowledge base (its index).
    Attr(usize),
}

/// The program words of a knowledge base, numbered: `(`, `)`, `return`, the functions, the
/// variables `v0..`, the relations, the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Words {
    /// Variables `v0 .. v<vars − 1>`.
    pub vars: usize,
    /// Relations of the knowledge base.
    pub relations: usize,
    /// Attributes of the knowledge base.
    pub attributes: usize,
}

impl Words {
    const FIXED: usize = 3 + FUNCS.len();

    /// How many words there are.
    pub fn len(&self) -> usize {
        Self::FIXED + self.vars + self.relations + self.attributes
    }

    /// Never: there are always the fixed words.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The number of `w`.
    pub fn index(&self, w: Word) -> usize {
        match w {
            Word::Open => 0,
            Word::Close => 1,
            Word::Return => 2,
            Word::Func(f) => 3 + FUNCS.iter().position(|g| *g == f).unwrap_or(0),
            Word::Var(i) => Self::FIXED + i,
            Word::Rel(i) => Self::FIXED + self.vars + i,
            Word::Attr(i) => Self::FIXED + self.vars + self.relations + i,
        }
    }

    /// The word numbered `i` (`None` past the end).
    pub fn word(&self, i: usize) -> Option<Word> {
        let (v, r) = (
            Self::FIXED + self.vars,
            Self::FIXED + self.vars + self.relations,
        );
        Some(match i {
            0 => Word::Open,
            1 => Word::Close,
            2 => Word::Return,
            3..Self::FIXED => Word::Func(FUNCS[i - 3]),
            _ if i < v => Word::Var(i - Self::FIXED),
            _ if i < r => Word::Rel(i - v),
            _ if i < self.len() => Word::Attr(i - r),
            _ => return None,
        })
    }

    /// The text of `w` (relations and attributes by their knowledge-base names).
    pub fn text(&self, w: Word, kb: &Kb) -> String {
        match w {
            Word::Open => "(".into(),
            Word::Close => ")".into(),
            Word::Return => "return".into(),
            Word::Func(f) => f.name().into(),
            Word::Var(i) => format!("v{i}"),
            Word::Rel(i) => kb.relations[i].clone(),
            Word::Attr(i) => kb.attributes[i].clone(),
        }
    }

    /// The word whose text is `s`, if any.
    pub fn parse(&self, s: &str, kb: &Kb) -> Option<Word> {
        (0..self.len())
            .filter_map(|i| self.word(i))
            .find(|w| self.text(*w, kb) == s)
    }
}

/// A program the computer refuses: the word that was not allowed and where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("program word {position} ({word}) is not allowed here")]
pub struct ProgramError {
    /// The word's position in the program.
    pub position: usize,
    /// The word, as text.
    pub word: String,
}

/// A program being written: the variables so far, the expression in progress, and whether it
/// has returned.
#[derive(Debug, Clone)]
pub struct Computer<'k> {
    kb: &'k Kb,
    words: Words,
    vars: Vec<Value>,
    initial: usize,
    partial: Vec<Word>,
    max_exprs: usize,
    pushed: usize,
    done: bool,
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Set(s) => write!(f, "{s:?}"),
            Value::Num(n) => write!(f, "{n}"),
        }
    }
}

impl<'k> Computer<'k> {
    /// A computer holding the question's entities as `v0, v1, …` (NSM's key-variable memory
    /// after entity linking), allowing `max_exprs` expressions (`words.vars` bounds the
    /// variables too).
    pub fn new(kb: &'k Kb, words: Words, entities: &[usize], max_exprs: usize) -> Self {
        let vars: Vec<Value> = entities.iter().map(|e| Value::Set(vec![*e])).collect();
        let max_exprs = max_exprs.min(words.vars.saturating_sub(vars.len()));
        Self {
            kb,
            words,
            initial: vars.len(),
            vars,
            partial: Vec::new(),
            max_exprs,
            pushed: 0,
            done: false,
        }
    }

    /// Whether the program has returned.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// The answer: the last variable, once the program has returned.
    pub fn answer(&self) -> Option<&Value> {
        self.done.then(|| self.vars.last()).flatten()
    }

    /// The words that may come next (empty once returned); never empty before.
    pub fn allowed(&self) -> Vec<Word> {
        if self.done {
            return Vec::new();
        }
        match self.partial.as_slice() {
            [] => {
                let mut out = Vec::new();
                if self.vars.len() - self.initial < self.max_exprs && !self.calls(None).is_empty() {
                    out.push(Word::Open);
                }
                if self.vars.len() > self.initial || out.is_empty() {
                    out.push(Word::Return);
                }
                out
            }
            [Word::Open] => {
                let calls = self.calls(None);
                FUNCS
                    .iter()
                    .filter(|f| calls.iter().any(|c| c.0 == **f))
                    .map(|f| Word::Func(*f))
                    .collect()
            }
            [Word::Open, Word::Func(f)] => {
                let mut vars: Vec<usize> = self.calls(Some(*f)).iter().map(|c| c.1).collect();
                vars.dedup();
                vars.into_iter().map(Word::Var).collect()
            }
            [Word::Open, Word::Func(Func::Count), Word::Var(_)] => vec![Word::Close],
            [Word::Open, Word::Func(f), Word::Var(v)] => self
                .calls(Some(*f))
                .iter()
                .filter(|c| c.1 == *v)
                .filter_map(|c| c.2)
                .collect(),
            [Word::Open, Word::Func(_), Word::Var(_), _] => vec![Word::Close],
            _ => Vec::new(),
        }
    }

    /// Appends `w`, running the expression it closes.
    ///
    /// # Errors
    /// [`ProgramError`] when `w` is not among [`allowed`](Self::allowed) (nothing changes).
    pub fn push(&mut self, w: Word) -> Result<(), ProgramError> {
        if !self.allowed().contains(&w) {
            return Err(ProgramError {
                position: self.pushed,
                word: self.words.text(w, self.kb),
            });
        }
        self.pushed += 1;
        match w {
            Word::Return => self.done = true,
            Word::Close => {
                let call = match self.partial[..] {
                    [_, Word::Func(f), Word::Var(v)] => (f, v, None),
                    [_, Word::Func(f), Word::Var(v), a] => (f, v, Some(a)),
                    _ => unreachable!("`)` is allowed only after a whole call"),
                };
                let value = self
                    .eval(call)
                    .unwrap_or_else(|| unreachable!("allowed calls run"));
                self.vars.push(value);
                self.partial.clear();
            }
            _ => self.partial.push(w),
        }
        Ok(())
    }

    /// The calls `(f, v, argument)` that run, give a non-empty value and add a value no
    /// variable holds (of function `only`, when given), in the order of functions, variables,
    /// arguments.
    fn calls(&self, only: Option<Func>) -> Vec<(Func, usize, Option<Word>)> {
        let mut out = Vec::new();
        for f in FUNCS.iter().filter(|f| only.is_none_or(|o| o == **f)) {
            for v in 0..self.vars.len() {
                let args: Vec<Option<Word>> = match f {
                    Func::Count => vec![None],
                    Func::Hop => (0..self.kb.relations.len())
                        .map(|r| Some(Word::Rel(r)))
                        .collect(),
                    _ => (0..self.kb.attributes.len())
                        .map(|a| Some(Word::Attr(a)))
                        .collect(),
                };
                for a in args {
                    if self
                        .eval((*f, v, a))
                        .is_some_and(|x| !self.vars.contains(&x))
                    {
                        out.push((*f, v, a));
                    }
                }
            }
        }
        out
    }

    /// The value of `( f v a )`, or `None` when it does not run (wrong type, an empty result,
    /// an `argmax`/`argmin` over fewer than two entities or over one lacking the attribute).
    fn eval(&self, (f, v, a): (Func, usize, Option<Word>)) -> Option<Value> {
        let Some(Value::Set(set)) = self.vars.get(v) else {
            return None;
        };
        let kb = self.kb;
        let out = match (f, a) {
            (Func::Count, None) => {
                return (!set.is_empty()).then_some(Value::Num(set.len() as i64));
            }
            (Func::Hop, Some(Word::Rel(r))) => {
                let mut out: Vec<usize> = set.iter().flat_map(|e| kb.hop(*e, r)).collect();
                out.sort_unstable();
                out.dedup();
                out
            }
            (Func::ArgMax | Func::ArgMin, Some(Word::Attr(at))) if set.len() >= 2 => {
                let vals: Option<Vec<i64>> = set.iter().map(|e| kb.attr(*e, at)).collect();
                let vals = vals?;
                let best = if f == Func::ArgMax {
                    vals.iter().max()
                } else {
                    vals.iter().min()
                }?;
                set.iter()
                    .zip(&vals)
                    .filter(|(_, x)| *x == best)
                    .map(|(e, _)| *e)
                    .collect()
            }
            _ => return None,
        };
        (!out.is_empty()).then_some(Value::Set(out))
    }
}

/// Runs `program` from the question's `entities`; the answer.
///
/// # Errors
/// [`ProgramError`] at the first word the computer does not allow, or when the program ends
/// before `return` (position = its length, word `<end>`).
pub fn run(
    kb: &Kb,
    words: Words,
    entities: &[usize],
    max_exprs: usize,
    program: &[Word],
) -> Result<Value, ProgramError> {
    let mut c = Computer::new(kb, words, entities, max_exprs);
    for w in program {
        c.push(*w)?;
    }
    c.answer().cloned().ok_or(ProgramError {
        position: program.len(),
        word: "<end>".into(),
    })
}

/// The answer's F1 against the gold answer (NSM's reward on WebQuestionsSP): the harmonic
/// mean of precision and recall of the entity sets; 1 for equal numbers; 0 for a type mismatch.
pub fn f1(answer: &Value, gold: &Value) -> f32 {
    match (answer, gold) {
        (Value::Num(a), Value::Num(g)) => f32::from(u8::from(a == g)),
        (Value::Set(a), Value::Set(g)) => {
            let hit = a.iter().filter(|e| g.binary_search(e).is_ok()).count() as f32;
            if hit == 0.0 {
                return 0.0;
            }
            let (p, r) = (hit / a.len() as f32, hit / g.len() as f32);
            2.0 * p * r / (p + r)
        }
        _ => 0.0,
    }
}
