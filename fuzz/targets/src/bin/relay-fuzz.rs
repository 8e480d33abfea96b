//! `relay-fuzz seed DIR` writes the seed corpus; `relay-fuzz run TARGET FILE...` replays inputs on stable.

use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("seed") if args.len() == 2 => {
            match relay_fuzz::seeds::write_corpus(Path::new(&args[1])) {
                Ok(counts) => {
                    for (target, n) in counts {
                        println!("{target}: {n} seeds");
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("relay-fuzz seed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("run") if args.len() >= 3 => {
            let Some(run) = relay_fuzz::target(&args[1]) else {
                eprintln!("relay-fuzz run: no target {:?}", args[1]);
                return ExitCode::FAILURE;
            };
            for file in &args[2..] {
                let data = match std::fs::read(file) {
                    Ok(d) => d,
                    Err(e) => {
                        eprintln!("relay-fuzz run: {file}: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                run(&data);
                println!("{file}: ok");
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: relay-fuzz seed DIR | relay-fuzz run TARGET FILE...");
            ExitCode::from(2)
        }
    }
}
