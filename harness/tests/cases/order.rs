//! The order the cases start in: longest first, so the long waits overlap the short cases
//! instead of running alone at the end (in the catalogue's order the longest family, standby,
//! comes last). A case's length is estimated from its file, nothing is listed: a step costs
//! about a second on a loaded host, a floor (`at_least`) is waited out whole, and a cluster
//! starts three brokers.

use delivery_harness::kit::catalogue::Catalogue;
use delivery_harness::kit::shape::{Preset, Shape};
use delivery_harness::kit::Case;

/// What one step is taken to cost, ms.
const STEP_MS: u64 = 1_000;
/// What a 3-node cluster's start and its heavier steps are taken to add, ms.
const CLUSTER_MS: u64 = 8_000;

/// Sorts `units` (a case's index in `cat` and a shape) longest first; ties keep the
/// catalogue's order.
pub fn longest_first(cat: &Catalogue, units: &mut [(usize, Shape)]) {
    units.sort_by_key(|(i, shape)| std::cmp::Reverse(estimate_ms(&cat.cases[*i], shape)));
}

/// The estimated length of `case` on `shape` in its scaled form, ms.
fn estimate_ms(case: &Case, shape: &Shape) -> u64 {
    let vars = case.vars_for(true);
    let floors: u64 = case
        .steps
        .iter()
        .filter_map(|s| s.timing.at_least.as_ref())
        .filter_map(|d| d.eval(&vars).ok())
        .sum();
    let cluster = if shape.has(Preset::Cluster) {
        CLUSTER_MS
    } else {
        0
    };
    STEP_MS * case.steps.len() as u64 + floors + cluster
}
