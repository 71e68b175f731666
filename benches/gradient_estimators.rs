//! `cargo bench --bench gradient_estimators [-- OUT.json [REPEATS]]`: the gradient-estimator
//! study of `recipes/control/study.rs` (docs/src/control.md).

fn main() {
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let out = args
        .next()
        .unwrap_or_else(|| "target/gradient_study.json".into());
    let repeats = args.next().and_then(|r| r.parse().ok()).unwrap_or(100);
    if let Err(e) = ember::control::study::run(std::path::Path::new(&out), repeats) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
