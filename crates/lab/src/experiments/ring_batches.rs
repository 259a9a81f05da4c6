//! Batches round a ring of computing nodes (the xx network's team, `docs/lessons.md`): 4 Mbit
//! batches, each node computing on every batch, one batch at a time, pipelined, or on gRPC.
//!
//! A case measures, per policy (`meshwire`: K = 1; `meshwire-pipelined`: K = `pipelined_k`;
//! `grpc-unary-64k` and `grpc-stream`: the gRPC baselines, one batch at a time):
//! - `hop_transfer_ms_p50` / `_p99`: `n0` sends plain batches to `n1` over the warm connection
//!   (one warm-up batch first); first byte sent (just before the stream opens) to last byte
//!   received (the receiver has the end record), on the lab's shared clock;
//! - `ring_ping_ms`: the latest ring ping on the idle ring, before the batches start;
//! - `batches_per_s`: `batches` batches through the pipeline, from the first submission to the
//!   last result; `batches_failed` counts failures (0 expected);
//! - `hop_floor_ms`: the hop's physical floor from the case's link and batch size
//!   ([`workload::hop_floor_ms`]), the same for every policy; no `hop_transfer_ms` should be under it.
//!
//! [`workload`] holds what every policy shares, [`pipeline`] runs the meshwire policies and
//! `grpc` (feature `baselines`) the gRPC ones.

#[cfg(feature = "baselines")]
pub mod grpc;
pub mod pipeline;
pub mod workload;

use std::time::Duration;

pub use pipeline::{team_transform, Addresses, HopLog, Team};
pub use workload::{team_batch, Params, Workload};

use super::Trial;
use crate::scenario::ScenarioError;
use crate::stats::{round_metric, Metrics};

/// Runs one xx-team case under the trial's policy: `meshwire`, `meshwire-pipelined`, or (with
/// the `baselines` feature) `grpc-unary-64k` or `grpc-stream`.
pub fn run(
    trial: &Trial<'_>,
    progress: &mut dyn FnMut(Duration),
) -> Result<Metrics, ScenarioError> {
    let params: Params = trial.params()?;
    let case = trial.case;
    let link = case
        .link
        .spec()
        .map_err(|reason| ScenarioError::failed(case, reason))?;
    let mut metrics = match trial.policy {
        "meshwire" => pipeline::run(trial, &params, 1, progress)?,
        "meshwire-pipelined" => {
            pipeline::run(trial, &params, params.pipelined_k as usize, progress)?
        }
        #[cfg(feature = "baselines")]
        other => match grpc::Baseline::from_policy(other) {
            Some(baseline) => grpc::run(case, trial.seed, &params, baseline, progress)?,
            None => return Err(unknown_policy(trial)),
        },
        #[cfg(not(feature = "baselines"))]
        _ => return Err(unknown_policy(trial)),
    };
    metrics.insert(
        "hop_floor_ms".into(),
        round_metric(workload::hop_floor_ms(&link, &params)),
    );
    Ok(metrics)
}

/// A case's hosts: `n0` (it measures) to `n{nodes-1}`.
pub fn hosts(case: &crate::scenario::CaseFile) -> Vec<String> {
    let nodes = case
        .params::<Params>()
        .map_or(Params::default().nodes, |params| params.nodes);
    (0..nodes).map(|index| format!("n{index}")).collect()
}

fn unknown_policy(trial: &Trial<'_>) -> ScenarioError {
    let baselines = if cfg!(feature = "baselines") {
        ", grpc-unary-64k, grpc-stream"
    } else {
        " (gRPC baselines need the `baselines` feature)"
    };
    trial.failed(format!(
        "unknown policy {:?}; xx-team runs meshwire, meshwire-pipelined{baselines}",
        trial.policy
    ))
}
