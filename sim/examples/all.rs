//! Runs every experiment and prints the tables and the elapsed time:
//! `cargo run --release -p graph-relay-sim --example all [SEED]`.

fn main() {
    let seed = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(graph_relay_sim::DEFAULT_SEED);
    let started = std::time::Instant::now();
    match graph_relay_sim::run(&[], seed) {
        Ok(outcomes) => {
            print!("{}", graph_relay_sim::render_text(&outcomes, seed));
            eprintln!(
                "all experiments in {:.2} s",
                started.elapsed().as_secs_f64()
            );
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
