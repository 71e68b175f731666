//! `cargo bench --bench gradient_estimators [-- OUT.json [REPEATS]]`: the gradient-estimator
//! study of `recipes/control/study.rs` (docs/src/control.md).

fn main() {
    ember::common::subnormals::flush_to_zero();
    let mut args = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .peekable();
    if args.peek().map(String::as_str) == Some("learn") {
        let _ = args.next();
        let seeds = args.next().and_then(|r| r.parse().ok()).unwrap_or(3);
        match ember::control::study::learning_study(seeds) {
            Ok(r) => {
                let text = serde_json::to_string(&r).unwrap_or_default();
                let _ = std::fs::write("target/learning_study.json", text);
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::exit(2);
            }
        }
        return;
    }
    let out = args
        .next()
        .unwrap_or_else(|| "target/gradient_study.json".into());
    let repeats = args.next().and_then(|r| r.parse().ok()).unwrap_or(100);
    if let Err(e) = ember::control::study::run(std::path::Path::new(&out), repeats) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
