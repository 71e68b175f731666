//! `cargo bench --bench llm`: see `src/bench.rs` (also `ember bench-llm`).

fn main() {
    ember::heap::keep_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = ember::bench::run(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
