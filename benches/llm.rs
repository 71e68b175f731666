//! `cargo bench --bench llm`: see `recipes/llm/jobs/bench.rs` (also `ember bench-llm`).

fn main() {
    ember::common::subnormals::flush_to_zero();
    ember::common::heap::keep_freed_memory();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Err(e) = ember::llm::jobs::bench::run(&args) {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
