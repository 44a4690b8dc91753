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

/// Reads and parses the policy document at `path`; the error names the file.
pub fn read(path: &std::path::Path) -> anyhow::Result<sluice_policies::Document> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    sluice_policies::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}
