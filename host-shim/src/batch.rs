//! Shared callouts, the shim's side: `POST /v1/checks` carries the checks
//! of many requests, and each is decided exactly as `POST /v1/check` would
//! decide it alone: its own atomic script call on its own slot, its own id
//! and lease, its own answer (a refusal, a 400 or a 503 stays that check's).
//!
//! The checks run concurrently: the store's connection pipelines the
//! script calls that are out at once (one write, one read for many), and on
//! a Cluster each goes to its own slot's node. A check that waits
//! (`wait_ms`) would hold every other answer until its slot: it is refused
//! here, and a filter sends it alone.

use futures_util::future::join_all;
use sluice_policies::bounds::MAX_BATCH;
use sluice_policies::wire::{CheckBatch, CheckRequest, CheckResponse, Encoding};

use crate::decision::CheckError;
use crate::limiter::Limiter;

/// Each check of `batch` decided, in order, as `POST /v1/check` decides
/// it; an error only for the batch itself (too many checks).
pub(crate) async fn decide(
    limiter: &Limiter,
    encoding: Encoding,
    batch: &CheckBatch,
) -> Result<Vec<Result<CheckResponse, CheckError>>, CheckError> {
    if batch.checks.len() > MAX_BATCH {
        let n = batch.checks.len();
        return Err(CheckError::BadRequest(format!(
            "{n} checks in a batch, more than the {MAX_BATCH} it may carry"
        )));
    }
    limiter.metrics.batch(batch.checks.len());
    Ok(join_all(batch.checks.iter().map(|body| one(limiter, encoding, body))).await)
}

/// One check of a batch.
async fn one(limiter: &Limiter, encoding: Encoding, body: &[u8]) -> Result<CheckResponse, CheckError> {
    match encoding.decode::<CheckRequest<'static>>(body) {
        Err(err) => Err(CheckError::BadRequest(format!("malformed request: {err}"))),
        Ok(req) if req.wait_ms.is_some_and(|w| w.get() > 0) => {
            Err(CheckError::BadRequest("wait_ms: a check that waits is sent alone, not in a batch".into()))
        }
        Ok(req) => limiter.metrics.decided(&req, limiter.check(&req).await),
    }
}
