//! Where calls meet their toolset's `max_concurrent_calls`: held back at
//! enqueue when the lane is full, let go when a running call of the lane
//! no longer needs its tool ([`crate::concurrency::Lanes`]).

use std::collections::BTreeSet;

use ferry_proto::bus::Work;
use ferry_proto::Event;

use super::Engine;
use crate::thread::{CallRecord, ThreadState};

impl Engine {
    /// The lane of a call (its toolset version, `Toolset@version`) and
    /// that version's limit, if it has one.
    fn lane_of(&self, call: &CallRecord) -> Option<(String, Option<usize>)> {
        let (qualified, version) = call.tool.split_once('@')?;
        let (toolset, _) = qualified.split_once('.')?;
        let version = semver::Version::parse(version).ok()?;
        let limit = self
            .registry
            .get(toolset, Some(&version))
            .and_then(|t| t.stored.policy.max_concurrent_calls)
            .map(|n| n as usize);
        Some((format!("{toolset}@{version}"), limit))
    }

    /// The work to send now: `work`, unless its lane is full (it then
    /// waits for room).
    pub(crate) fn admit(&self, group_id: &str, call: &CallRecord, work: Work) -> Option<Work> {
        let Some(lanes) = &self.lanes else {
            return Some(work);
        };
        match self.lane_of(call) {
            Some((lane, Some(limit))) => {
                let key = (group_id.to_owned(), call.id.clone());
                let admitted = lanes.admit(&lane, limit, key, work);
                if admitted.is_none() {
                    tracing::debug!(group_id, id = ?call.id, lane, "call waits for room in its toolset");
                }
                admitted
            }
            _ => Some(work),
        }
    }

    /// Counts a call found dispatched at a restart against its lane.
    pub(crate) fn hold_lane(&self, group_id: &str, call: &CallRecord) {
        if let (Some(lanes), Some((lane, Some(_)))) = (&self.lanes, self.lane_of(call)) {
            lanes.hold(&lane, (group_id.to_owned(), call.id.clone()));
        }
    }

    /// After a write: each call it touched that no longer needs its tool
    /// gives its room to the calls waiting longest, which are sent now.
    pub(crate) async fn release_lanes(&self, state: &ThreadState, events: &[Event]) {
        let Some(lanes) = self.lanes.as_ref().filter(|l| !l.is_empty()) else {
            return;
        };
        let group_id = state.meta.group_id.as_str();
        let touched: BTreeSet<&str> = events.iter().filter_map(|e| e.id.as_deref()).collect();
        for id in touched {
            let Some(call) = state.calls.get(id) else {
                continue;
            };
            if call.status.is_pending() {
                continue;
            }
            let Some((lane, limit)) = self.lane_of(call) else {
                continue;
            };
            if !lanes.knows(&lane) {
                continue;
            }
            // A limit removed meanwhile lets every waiting call go.
            let limit = limit.unwrap_or(usize::MAX);
            let key = (group_id.to_owned(), call.id.clone());
            for ((g, id), work) in lanes.release(&lane, limit, &key) {
                tracing::debug!(group_id = g, id = ?id, lane, "room in its toolset: dispatched");
                if let Err(e) = self.bus.publish(work).await {
                    // Still queued in the store: the next start sends it.
                    tracing::warn!(group_id = g, id = ?id, error = %e, "could not hand a waiting call to dispatch");
                }
            }
        }
    }
}
