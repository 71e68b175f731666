use super::kb::{Kb, KbSpec, Kind};
use super::lisp::{Computer, Func, Value, Word, Words, f1, run};
use super::*;

/// Country A (0) with cities b (1, the capital, population 10, founded 900) and c (2,
/// population 30, founded 1200); river r (3, length 500) through A and c.
fn small() -> (Kb, Words) {
    let mut kb = Kb::empty(
        &["country", "cities", "capital", "rivers", "countries"],
        &["population", "area", "founded", "length"],
    );
    let a = kb.add("A", Kind::Country);
    let b = kb.add("b", Kind::City);
    let c = kb.add("c", Kind::City);
    let r = kb.add("r", Kind::River);
    for (from, rel, to) in [(a, 1, b), (a, 1, c), (b, 0, a), (c, 0, a), (a, 2, b)] {
        kb.link(from, rel, to);
    }
    for (from, rel, to) in [(a, 3, r), (c, 3, r), (r, 4, a)] {
        kb.link(from, rel, to);
    }
    kb.set(b, 0, 10);
    kb.set(c, 0, 30);
    kb.set(b, 2, 900);
    kb.set(c, 2, 1200);
    kb.set(r, 3, 500);
    let words = Words {
        vars: 4,
        relations: 5,
        attributes: 4,
    };
    (kb, words)
}

#[test]
fn f1_is_the_harmonic_mean_of_precision_and_recall() {
    let s = |v: &[usize]| Value::Set(v.to_vec());
    // 2 of 3 right, 2 of 3 found: p = r = 2/3.
    assert!((f1(&s(&[1, 2, 3]), &s(&[2, 3, 4])) - 2.0 / 3.0).abs() < 1e-6);
    // p = 1/1, r = 1/4: 2·(1/4)/(5/4) = 0.4.
    assert!((f1(&s(&[2]), &s(&[1, 2, 3, 4])) - 0.4).abs() < 1e-6);
    assert_eq!(f1(&s(&[5]), &s(&[1])), 0.0);
    assert_eq!(f1(&Value::Num(3), &Value::Num(3)), 1.0);
    assert_eq!(f1(&Value::Num(3), &Value::Num(2)), 0.0);
    assert_eq!(f1(&Value::Num(1), &s(&[1])), 0.0);
}

#[test]
fn words_number_and_name_every_program_word() {
    let (kb, w) = small();
    assert_eq!(w.len(), 3 + 4 + 4 + 5 + 4);
    for i in 0..w.len() {
        let word = w.word(i).unwrap();
        assert_eq!(w.index(word), i);
        assert_eq!(w.parse(&w.text(word, &kb), &kb), Some(word));
    }
    assert_eq!(w.word(w.len()), None);
    assert_eq!(w.text(Word::Var(2), &kb), "v2");
    assert_eq!(w.text(Word::Rel(3), &kb), "rivers");
}

#[test]
fn the_computer_allows_exactly_the_words_that_keep_the_program_running() {
    let (kb, w) = small();
    let mut c = Computer::new(&kb, w, &[0], 3);
    // Nothing to return yet; `(` only.
    assert_eq!(c.allowed(), vec![Word::Open]);
    c.push(Word::Open).unwrap();
    // argmax/argmin need two entities ({A} has one); count runs (1); hop runs.
    assert_eq!(
        c.allowed(),
        vec![Word::Func(Func::Hop), Word::Func(Func::Count)]
    );
    c.push(Word::Func(Func::Hop)).unwrap();
    assert_eq!(c.allowed(), vec![Word::Var(0)]);
    c.push(Word::Var(0)).unwrap();
    // A has cities, a capital and rivers; no country, no countries.
    assert_eq!(c.allowed(), vec![Word::Rel(1), Word::Rel(2), Word::Rel(3)]);
    c.push(Word::Rel(1)).unwrap();
    assert_eq!(c.allowed(), vec![Word::Close]);
    c.push(Word::Close).unwrap();
    assert_eq!(c.allowed(), vec![Word::Open, Word::Return]);
    for x in [Word::Open, Word::Func(Func::Hop), Word::Var(1)] {
        c.push(x).unwrap();
    }
    // {b, c} → country gives {A}, which v0 holds: pruned; rivers gives {r}.
    assert_eq!(c.allowed(), vec![Word::Rel(3)]);
    let err = c.push(Word::Rel(0)).unwrap_err();
    assert_eq!((err.position, err.word.as_str()), (8, "country"));
    assert_eq!(
        c.allowed(),
        vec![Word::Rel(3)],
        "a refused word changes nothing"
    );
}

#[test]
fn programs_run_to_their_answers() {
    let (kb, w) = small();
    let p = |s: &str| -> Vec<Word> { s.split(' ').map(|x| w.parse(x, &kb).unwrap()).collect() };
    let biggest = p("( hop v0 cities ) ( argmax v1 population ) return");
    assert_eq!(run(&kb, w, &[0], 3, &biggest), Ok(Value::Set(vec![2])));
    let oldest = p("( hop v0 cities ) ( argmin v1 founded ) return");
    assert_eq!(run(&kb, w, &[0], 3, &oldest), Ok(Value::Set(vec![1])));
    let count = p("( hop v0 cities ) ( count v1 ) return");
    assert_eq!(run(&kb, w, &[0], 3, &count), Ok(Value::Num(2)));
    // Lengths are attributes of rivers only: argmax over cities by length does not run.
    let bad = p("( hop v0 cities ) ( argmax v1 length ) return");
    assert_eq!(run(&kb, w, &[0], 3, &bad).unwrap_err().position, 8);
    // A program must return; after max_exprs expressions only `return` is allowed.
    let open = p("( hop v0 cities )");
    assert_eq!(run(&kb, w, &[0], 3, &open).unwrap_err().word, "<end>");
    let mut c = Computer::new(&kb, w, &[0], 1);
    for x in p("( hop v0 cities )") {
        c.push(x).unwrap();
    }
    assert_eq!(c.allowed(), vec![Word::Return]);
}

#[test]
fn generated_questions_are_answerable_split_and_fixed_by_the_world_seed() {
    let spec = KbSpec::default();
    let t = ProgramTask::new(&spec, 3).unwrap();
    assert_eq!(t, ProgramTask::new(&spec, 3).unwrap());
    assert!(t.questions.len() > 300, "{}", t.questions.len());
    let share = t.held_out.len() as f64 / t.questions.len() as f64;
    assert!((0.12..0.28).contains(&share), "{share}");
    assert_eq!(t.train.len() + t.held_out.len(), t.questions.len());
    // Every template has questions; the gold program of each earns reward 1.
    for tpl in 0..TEMPLATES.len() {
        assert!(
            t.questions.iter().any(|q| q.template == tpl),
            "template {tpl}"
        );
    }
    for q in &t.questions {
        let gold: Vec<u32> = TEMPLATES[q.template]
            .2
            .split(' ')
            .map(|s| t.vocab.token(t.words.parse(s, &t.kb).unwrap()))
            .chain([t.vocab.token(Word::Return), EOS])
            .collect();
        assert_eq!(t.reward(q, &gold), 1.0, "{:?}", q.words);
        let p = t.prompt(q);
        assert_eq!(
            (p[0], p[p.len() - 1], p.len()),
            (BOS, SEP, q.words.len() + 2)
        );
    }
    let other = ProgramTask::new(&KbSpec { seed: 1, ..spec }, 3).unwrap();
    assert_ne!(t.kb, other.kb);
    // A world too small for a held-out split is refused, never an empty split.
    let tiny = |seed| KbSpec {
        countries: 1,
        cities_per_country: 1,
        rivers: 1,
        seed,
    };
    let refused = (0..64)
        .filter(|s| ProgramTask::new(&tiny(*s), 3).is_err())
        .count();
    assert!(refused > 0, "some tiny world has no held-out question");
    for s in 0..64 {
        if let Ok(t) = ProgramTask::new(&tiny(s), 3) {
            assert!(!t.train.is_empty() && !t.held_out.is_empty());
        } else {
            let e = ProgramTask::new(&tiny(s), 3).unwrap_err();
            assert!(e.contains("held-out questions"), "{e}");
        }
    }
}

/// Any walk through the allowed tokens ends in `<eos>` within 5 tokens per expression + 2,
/// and its program runs (its reward is a number in [0, 1]).
#[test]
fn every_walk_through_the_allowed_tokens_is_a_program_that_runs() {
    let t = ProgramTask::new(&KbSpec::default(), 3).unwrap();
    let mut rng = SplitMix64(3);
    for _ in 0..2000 {
        let q = &t.questions[rng.below(t.questions.len() as u64) as usize];
        let mut drawn = Vec::new();
        loop {
            let allowed = t.allowed(q, &drawn);
            assert!(!allowed.is_empty(), "{}", t.program_text(&drawn));
            let tok = allowed[rng.below(allowed.len() as u64) as usize];
            drawn.push(tok);
            if tok == EOS {
                break;
            }
            assert!(drawn.len() <= 5 * 3 + 1, "{}", t.program_text(&drawn));
        }
        let words: Vec<Word> = drawn[..drawn.len() - 1]
            .iter()
            .map(|x| t.vocab.word(*x).unwrap())
            .collect();
        assert!(run(&t.kb, t.words, &q.entities, 3, &words).is_ok());
        assert!((0.0..=1.0).contains(&t.reward(q, &drawn)));
        assert!(t.allowed(q, &drawn).is_empty(), "nothing after <eos>");
    }
}

#[test]
fn the_environment_rewards_a_programs_answer() {
    let t = ProgramTask::new(&KbSpec::default(), 3).unwrap();
    let mut env = ProgramEnv::new(t.clone());
    let seed = (0u64..)
        .find(|s| !crate::env::EpisodeSource::held_out(*s))
        .unwrap();
    let obs = env.reset(&[Episode { id: 7, seed }]).unwrap();
    let q = t
        .questions
        .iter()
        .find(|q| q.words.join(" ") == obs[0])
        .unwrap();
    let gold = format!("{} return", TEMPLATES[q.template].2);
    let fb = env.step(&[(7, gold)]).unwrap();
    assert_eq!((fb[0].reward, fb[0].done), (1.0, true));
    env.reset(&[Episode { id: 7, seed }]).unwrap();
    let fb = env.step(&[(7, "( nonsense".into())]).unwrap();
    assert_eq!(fb[0].reward, 0.0);
    assert!(
        env.step(&[(7, "return".into())]).is_err(),
        "the episode is over"
    );
}
