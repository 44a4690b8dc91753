//! `sluice validate FILE...`: check policy documents before they reach Envoy.

use std::path::PathBuf;
use std::process::ExitCode;

pub fn run(files: &[PathBuf]) -> ExitCode {
    let mut failed = false;
    for file in files {
        let shown = file.display();
        match std::fs::read_to_string(file) {
            Err(err) => {
                failed = true;
                println!("{shown}: cannot read: {err}");
            }
            Ok(text) => match sluice_policies::parse(&text) {
                Ok(_) => println!("{shown}: ok"),
                Err(err) => {
                    failed = true;
                    println!("{shown}: {err}");
                }
            },
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
