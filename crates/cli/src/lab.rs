//! `meshwire lab`: list and run scenario files.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use meshwire_lab::{run_scenario, ScenarioFile};

#[derive(Debug, clap::Subcommand)]
pub enum LabCommand {
    /// Run one scenario and print its table (or one JSON object with --json).
    Run {
        /// The scenario file.
        file: PathBuf,
        /// Override the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Print exactly one JSON object instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List the scenarios in a directory, one line each.
    List {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
    },
}

pub fn run(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Run { file, seed, json } => {
            let scenario = ScenarioFile::load(&file)?;
            let seed = seed.unwrap_or(scenario.seed);
            let show_progress = std::io::stderr().is_terminal();
            let report = run_scenario(&scenario, seed, |case, elapsed| {
                if show_progress {
                    eprint!("\r\x1b[2K{case}: {:.1} s virtual", elapsed.as_secs_f64());
                    let _ = std::io::stderr().flush();
                }
            })?;
            if show_progress {
                eprint!("\r\x1b[2K");
            }
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_table());
            }
            Ok(())
        }
        LabCommand::List { dir } => {
            for path in scenario_files(&dir)? {
                let scenario = ScenarioFile::load(&path)?;
                println!(
                    "{:<32} {:<14} {}",
                    path.display(),
                    scenario.kind,
                    scenario.description
                );
            }
            Ok(())
        }
    }
}

/// The `.toml` files in `dir`, sorted.
pub fn scenario_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    Ok(files)
}
