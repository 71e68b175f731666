use super::*;
use ember_tasks::reward::Check;

fn spec() -> LanpoSpec {
    crate::common::config::from_toml(toml::Table::new()).unwrap_or_else(|e| panic!("{e}"))
}

fn example(question: &str, answer: &str) -> Example {
    Example {
        prompt: format!("{question}="),
        answer: answer.into(),
        question: question.into(),
        check: Check::Numeric,
        messages: Vec::new(),
        columns: serde_json::Map::new(),
    }
}

fn lesson(source: &str, text: &str, embedding: Vec<f32>) -> Lesson {
    Lesson {
        source: source.into(),
        text: text.into(),
        embedding,
    }
}

/// The contexts of one problem with `m` feedback samples.
fn contexts(pool: &Pool, spec: &LanpoSpec, e: &Example, fresh: &[&str], m: usize) -> Vec<String> {
    let k = key(e);
    let emb = [1.0f32, 0.0];
    let fresh = vec![fresh.iter().map(|s| s.to_string()).collect()];
    plan(pool, spec, &[(k.as_str(), e, &emb)], &fresh, m)
        .into_iter()
        .map(|f| f.text)
        .collect()
}

#[test]
fn a_reflection_context_is_the_same_whatever_the_rewards_and_the_answer() {
    // Reward-Agnostic Reflection: two pools that differ only in the stored rewards, asked for
    // two problems that differ only in their reference answers, give byte-identical contexts,
    // and neither shows the reward or the answer.
    let s = spec();
    let (e1, e2) = (example("12 + 30", "42"), example("12 + 30", "4242"));
    let mut contexts_seen = Vec::new();
    for (e, reward) in [(&e1, 1.0f32), (&e2, 0.8125)] {
        let mut pool = Pool::default();
        let attempts = ["I think 41", "It is 40 or so"].map(|t| Attempt {
            text: t.into(),
            reward,
        });
        pool.record(&key(e), attempts.to_vec(), 1, &s);
        let c = contexts(&pool, &s, e, &["41"], 3);
        for text in &c {
            assert!(
                !text.contains("0.8125") && !contains_word(text, &e.answer),
                "{text}"
            );
            assert!(
                !text.contains("reward") && !text.contains("correct"),
                "{text}"
            );
        }
        contexts_seen.push(c);
    }
    assert_eq!(contexts_seen[0], contexts_seen[1]);
    // Sample j reflects on this step's attempt, then the pool's newest first, cycling.
    let c = &contexts_seen[0];
    assert!(
        c[0].contains("\n41\n") && c[1].contains("It is 40 or so") && c[2].contains("I think 41")
    );
    assert_eq!(c[0], render_feedback(&[], Some("41")));
}

#[test]
fn lessons_come_from_other_similar_problems_and_never_hold_the_answer() {
    let s = spec();
    let e = example("12 + 30", "42");
    let mut pool = Pool::default();
    // The centre is the mean of what was observed: (0, 0) here, so similarity is the cosine.
    pool.observe(&[1.0, 1.0]);
    pool.observe(&[-1.0, -1.0]);
    // The same problem's own lesson (it was chosen because the problem was solved) is never
    // shown: intra-problem information reaches the context only through a reflection.
    pool.add_lesson(lesson(&key(&e), "Its own tip", vec![1.0, 0.0]), 10);
    pool.add_lesson(lesson("other-a", "Add the tens first", vec![0.9, 0.1]), 10);
    pool.add_lesson(lesson("other-b", "Unrelated tip", vec![0.0, 1.0]), 10);
    pool.add_lesson(lesson("other-c", "The answer is 42", vec![1.0, 0.0]), 10);
    pool.add_lesson(
        lesson("other-d", "Add the tens first", vec![0.95, 0.05]),
        10,
    );
    let found = pool.relevant(&key(&e), &[1.0, 0.0], &e.answer, 2, 0.5);
    let texts: Vec<&str> = found.iter().map(|f| f.0).collect();
    assert_eq!(texts, ["Add the tens first"]);
    let expected = 0.95 / (0.95f64 * 0.95 + 0.05 * 0.05).sqrt();
    assert!((found[0].1 - expected).abs() < 1e-6);
    let no_reflection = LanpoSpec {
        reflection: false,
        similarity: 0.5,
        ..s
    };
    let c = contexts(&pool, &no_reflection, &e, &["41"], 2);
    assert_eq!(
        c[0],
        "\n\nTips learned on similar questions:\n- Add the tens first"
    );
}

#[test]
fn a_lesson_keeps_none_of_its_sources_numbers() {
    let sources = ["What is 12 + 30?", "42", "42"];
    let l = clean_lesson(
        "  \nAdd 12 and 30 to get 42, carry 1 when over 9.\nmore",
        &sources,
    );
    assert_eq!(
        l.as_deref(),
        Some("Add N and N to get N, carry 1 when over 9.")
    );
    assert_eq!(clean_lesson(" \n  ", &sources), None);
    assert!(contains_word("is 42.", "42") && !contains_word("is 420", "42"));
    assert!(!contains_word("x142", "42") && !contains_word("anything", ""));
}

#[test]
fn the_pool_keeps_the_newest_attempts_and_the_recent_problems() {
    let s = LanpoSpec {
        attempts_kept: 2,
        problems_kept: 2,
        ..spec()
    };
    let mut pool = Pool::default();
    let a = |t: &str| Attempt {
        text: t.into(),
        reward: 0.0,
    };
    pool.record("p1", vec![a("1"), a("2"), a("3")], 1, &s);
    let texts: Vec<&str> = pool
        .attempts("p1")
        .iter()
        .map(|a| a.text.as_str())
        .collect();
    assert_eq!(texts, ["3", "2"]);
    pool.record("p2", vec![a("x")], 2, &s);
    pool.record("p3", vec![a("y")], 3, &s);
    assert_eq!(pool.sizes(), (2, 0));
    assert!(pool.attempts("p1").is_empty() && pool.attempts("p2").len() == 1);
    for i in 0..5 {
        pool.add_lesson(lesson("p", &i.to_string(), vec![0.0; 2]), 3);
    }
    assert_eq!(pool.sizes(), (2, 3));
}

#[test]
fn a_saved_pool_reads_back_and_a_foreign_one_is_named() {
    let dir = std::env::temp_dir().join(format!("ember-lanpo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let s = spec();
    let mut pool = Pool::default();
    pool.record(
        "p",
        vec![Attempt {
            text: "7".into(),
            reward: 1.0,
        }],
        1,
        &s,
    );
    pool.observe(&[0.5, 0.25]);
    pool.add_lesson(lesson("p", "tip", vec![0.5, 0.25]), 10);
    pool.save(&dir).unwrap_or_else(|e| panic!("{e}"));
    let back = Pool::load(&dir, &s, 2).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(back, pool);
    let err = Pool::load(&dir, &s, 3).err().map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("hidden size 3")));
    std::fs::write(dir.join(POOL_FILE), "{\"problems\": 3}").unwrap_or_else(|e| panic!("{e}"));
    let err = Pool::load(&dir, &s, 2).err().map(|e| e.to_string());
    assert!(err.is_some_and(|e| e.contains("not a LANPO pool")));
    let _ = std::fs::remove_dir_all(&dir);
}
