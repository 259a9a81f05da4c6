//! `meshwire lab`: list and run scenario files.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use meshwire_lab::{experiments, run_scenario, Mode, ScenarioFile, Sweep, EXPERIMENTS};

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
        /// Cross-check on real UDP sockets on loopback in real time (127.0.0.2 and up) instead of
        /// virtual time. Not deterministic; crash and restart events are not supported.
        #[arg(long)]
        realtime: bool,
    },
    /// Run an experiment over randomly drawn cases and report each result's ratio to its
    /// physical floor: per case, per policy's distribution, and the worst cases.
    Sweep {
        /// The sweep file (see scenarios/sweeps/).
        file: PathBuf,
        /// How many cases to draw (default: the file's `cases`).
        #[arg(long)]
        cases: Option<usize>,
        /// Override the sweep's seed (same seed, same cases, same report).
        #[arg(long)]
        seed: Option<u64>,
        /// Print exactly one JSON object instead of tables.
        #[arg(long)]
        json: bool,
        /// Print case K as an ordinary scenario file (to rerun and debug it alone) and exit.
        #[arg(long, value_name = "K")]
        print_case: Option<usize>,
    },
    /// Run every scenario in a directory and write the scoreboard (docs/RESULTS.md).
    Results {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
        /// Where to write the Markdown.
        #[arg(long, default_value = "docs/RESULTS.md")]
        out: PathBuf,
    },
    /// List the scenarios in a directory, one line each, then the experiment kinds they can use.
    List {
        /// Where the scenario files are.
        #[arg(long, default_value = "scenarios")]
        dir: PathBuf,
    },
}

pub fn run(command: LabCommand) -> anyhow::Result<()> {
    match command {
        LabCommand::Run {
            file,
            seed,
            json,
            realtime,
        } => {
            let scenario = ScenarioFile::load(&file)?;
            let seed = seed.unwrap_or(scenario.seed);
            let show_progress = std::io::stderr().is_terminal();
            let mode = if realtime {
                Mode::Realtime
            } else {
                Mode::Virtual
            };
            let report = run_scenario(&scenario, seed, mode, |case, elapsed| {
                if show_progress {
                    eprint!("\r\x1b[2K{case}: {:.1} s", elapsed.as_secs_f64());
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
        LabCommand::Sweep {
            file,
            cases,
            seed,
            json,
            print_case,
        } => {
            let sweep = Sweep::load(&file)?;
            let seed = seed.unwrap_or(sweep.file().seed);
            if let Some(index) = print_case {
                print!("{}", sweep.case_text(seed, index));
                return Ok(());
            }
            let cases = cases.unwrap_or(sweep.file().cases);
            if cases == 0 {
                anyhow::bail!("--cases must be at least 1");
            }
            let show_progress = std::io::stderr().is_terminal();
            let report = sweep.run(seed, cases, |progress| {
                if show_progress {
                    eprint!(
                        "\r\x1b[2K[{}/{}] {}: {:.1} s",
                        progress.done,
                        progress.total,
                        progress.trial,
                        progress.elapsed.as_secs_f64()
                    );
                    let _ = std::io::stderr().flush();
                }
            });
            if show_progress {
                eprint!("\r\x1b[2K");
            }
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_table(&file.display().to_string()));
            }
            Ok(())
        }
        LabCommand::Results { dir, out } => {
            let mut markdown = String::from(RESULTS_HEADER);
            for path in scenario_files(&dir)? {
                let scenario = ScenarioFile::load(&path)?;
                eprintln!("running {}", path.display());
                let report = run_scenario(&scenario, scenario.seed, Mode::Virtual, |_, _| {})
                    .with_context(|| format!("scenario {} failed", path.display()))?;
                markdown.push_str(&format!(
                    "## {}\n\n{}\n\nFile: `{}`. Command: `meshwire lab run {}`.\n\n{}\n",
                    scenario.name,
                    scenario.description,
                    path.display(),
                    path.display(),
                    report.to_table()
                ));
                if experiments::find(&scenario.kind).is_some_and(|experiment| experiment.realtime) {
                    eprintln!("running {} on real sockets", path.display());
                    let real = run_scenario(&scenario, scenario.seed, Mode::Realtime, |_, _| {})
                        .with_context(|| format!("real-time run of {} failed", path.display()))?;
                    markdown.push_str(&format!(
                        "### {} on real UDP sockets (cross-check)\n\nThe same scenario over \
                         loopback in real time, the emulated socket adding delay, rate and loss \
                         in user space. Command: `meshwire lab run --realtime {}`. These numbers \
                         vary from run to run.\n\n{}\n",
                        scenario.name,
                        path.display(),
                        real.to_table()
                    ));
                }
            }
            std::fs::write(&out, markdown)
                .with_context(|| format!("cannot write {}", out.display()))?;
            eprintln!("wrote {}", out.display());
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
            println!("\nkinds (policies), then their workloads:");
            for experiment in EXPERIMENTS {
                println!(
                    "{:<14} {} ({})",
                    experiment.kind,
                    experiment.description,
                    experiment.policies.join(", ")
                );
                for workload in experiment.workloads {
                    println!("  {:<14} {}", workload.name, workload.description);
                }
            }
            Ok(())
        }
    }
}

const RESULTS_HEADER: &str = "# Results\n\n\
Every scenario's latest numbers (every file in `scenarios/`, run in the lab) and the criterion\n\
benchmarks. `meshwire lab results` writes the scenario part; the script adds the benchmarks.\n\
Regenerate this page with:\n\n\
```bash\n\
bash scripts/results.sh\n\
```\n\n\
Each table lists the metrics per case and policy, then the scenario's anchors: the published\n\
figures (or, for calibration, the theoretical values) the numbers are judged against. Virtual-time\n\
metrics are deterministic for a seed; `wall_clock_s` is measured on the machine that ran the\n\
command (a 2-core, 24 GiB machine for the committed page).\n\n";

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
