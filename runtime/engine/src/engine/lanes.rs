//! Where calls meet their toolset's `max_concurrent_calls`. In one process
//! they are held back at enqueue when the lane is full and let go when a
//! running call of the lane no longer needs its tool
//! ([`crate::concurrency::Lanes`]). On a cluster a worker enters each call
//! in the shared lane before it dispatches it, and the process that writes
//! a call's end leaves the lane for it ([`crate::shared_lanes`]).

use std::collections::BTreeSet;

use ferry_proto::bus::Work;
use ferry_proto::Event;

use super::{Engine, Error};
use crate::shared_lanes::{Entered, Order, Swept};
use crate::thread::{CallRecord, ThreadState};

impl Engine {
    /// The lane of a call (its toolset version, `Toolset@version`) and
    /// that version's limit, if it has one.
    fn lane_of(&self, call: &CallRecord) -> Option<(String, Option<usize>)> {
        let (qualified, version) = call.tool.split_once('@')?;
        let (toolset, _) = qualified.split_once('.')?;
        let lane = format!("{toolset}@{version}");
        let limit = self.limit_of(&lane)?;
        Some((lane, limit))
    }

    /// The limit of lane `Toolset@version`; `None` when the lane is not
    /// a toolset version's name.
    fn limit_of(&self, lane: &str) -> Option<Option<usize>> {
        let (toolset, version) = lane.split_once('@')?;
        let version = semver::Version::parse(version).ok()?;
        Some(
            self.registry
                .get(toolset, Some(&version))
                .and_then(|t| t.stored.policy.max_concurrent_calls)
                .map(|n| n as usize),
        )
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
        if self.lanes.as_ref().is_none_or(|l| l.is_empty()) && self.shared_lanes.is_none() {
            return;
        }
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
            let key = (group_id.to_owned(), call.id.clone());
            if let Some(shared) = &self.shared_lanes {
                // Calls of a lane without a limit never entered it; when
                // a limit was removed, the sweep lets its waiting calls go.
                let Some(limit) = limit else { continue };
                if let Err(e) = shared.leave(&lane, limit, &key).await {
                    // The workers' sweep finds it ended and leaves for it.
                    tracing::warn!(group_id, id, lane, error = %e, "could not leave the call's lane");
                }
                continue;
            }
            let Some(lanes) = &self.lanes else { continue };
            if !lanes.knows(&lane) {
                continue;
            }
            // A limit removed meanwhile lets every waiting call go.
            let limit = limit.unwrap_or(usize::MAX);
            for ((g, id), work) in lanes.release(&lane, limit, &key) {
                tracing::debug!(group_id = g, id = ?id, lane, "room in its toolset: dispatched");
                if let Err(e) = self.bus.publish(work).await {
                    // Still queued in the store: the next start sends it.
                    tracing::warn!(group_id = g, id = ?id, error = %e, "could not hand a waiting call to dispatch");
                }
            }
        }
    }

    /// On a cluster, before a worker dispatches `call` (taken from the
    /// commit at stream position `seq`): whether it may go now. A call of
    /// a limited lane without room waits in the lane, and is handed to
    /// dispatch again once it has room ([`Engine::ready_work`]). One no
    /// longer waiting for dispatch goes on, for dispatch to skip.
    pub async fn enter_lane(
        &self,
        group_id: &str,
        call: &CallRecord,
        seq: u64,
    ) -> Result<bool, Error> {
        let Some(shared) = &self.shared_lanes else {
            return Ok(true);
        };
        let Some((lane, Some(limit))) = self.lane_of(call) else {
            return Ok(true);
        };
        // A commit taken again (a consumer made anew reads them all) names
        // calls long sent or ended: only one still waiting enters.
        let still_waiting = self.store.call(group_id, &call.id).await?;
        if !still_waiting.is_some_and(|c| c.awaits_dispatch()) {
            return Ok(true);
        }
        let key = (group_id.to_owned(), call.id.clone());
        let order = Order {
            accepted_ms: call.created_at.as_millis(),
            seq,
        };
        let entered = shared.enter(&lane, limit, &key, order).await?;
        if let Entered::Waits(place) = entered {
            tracing::debug!(
                group_id,
                id = call.id,
                lane,
                place,
                "call waits for room in its toolset"
            );
        }
        Ok(entered == Entered::Runs)
    }

    /// Whether `call` is of a lane with a limit (on a cluster).
    pub fn in_limited_lane(&self, call: &CallRecord) -> bool {
        self.shared_lanes.is_some() && matches!(self.lane_of(call), Some((_, Some(_))))
    }

    /// After a worker dispatched (or skipped) a call of a limited lane:
    /// if the call has ended meanwhile, perhaps before it entered, it
    /// leaves its lane (an end written earlier left nothing).
    pub async fn after_lane_dispatch(&self, group_id: &str, id: &str) -> Result<(), Error> {
        let Some(shared) = &self.shared_lanes else {
            return Ok(());
        };
        let Some(call) = self.store.call(group_id, id).await? else {
            return Ok(());
        };
        if call.status.is_pending() {
            return Ok(());
        }
        if let Some((lane, limit)) = self.lane_of(&call) {
            let key = (group_id.to_owned(), id.to_owned());
            shared
                .leave(&lane, limit.unwrap_or(usize::MAX), &key)
                .await?;
        }
        Ok(())
    }

    /// The work of a call handed out of its lane's wait, if it still
    /// waits for dispatch.
    pub async fn ready_work(&self, group_id: &str, id: &str) -> Result<Option<Work>, Error> {
        let Some(call) = self.store.call(group_id, id).await? else {
            return Ok(None);
        };
        if !call.awaits_dispatch() {
            return Ok(None);
        }
        let ancestors = self.store.thread(group_id).await?.and_then(|m| m.ancestors);
        Ok(self.work_for(group_id, &call, ancestors.as_deref()))
    }

    /// A worker's sweep of the shared lanes: a call holding room that has
    /// ended leaves; one given room long ago and never tried is handed to
    /// dispatch again; room a raised limit made is given out. Returns how
    /// many it changed.
    pub async fn sweep_lanes(&self) -> Result<usize, Error> {
        let Some(shared) = &self.shared_lanes else {
            return Ok(0);
        };
        let now = super::now().as_millis();
        let mut changed = 0;
        for (lane, record) in shared.lanes().await? {
            let limit = self.limit_of(&lane).flatten().unwrap_or(usize::MAX);
            for running in &record.running {
                let (group_id, id) = &running.key;
                let call = self.store.call(group_id, id).await?;
                match Swept::of(running, call.as_ref(), now) {
                    Swept::Keep => continue,
                    Swept::Leave => shared.leave(&lane, limit, &running.key).await?,
                    Swept::HandOut => shared.hand_out(&running.key, running.since_ms).await?,
                }
                changed += 1;
            }
            if record.running.len() < limit && !record.waiting.is_empty() {
                shared.promote(&lane, limit).await?;
                changed += 1;
            }
        }
        Ok(changed)
    }
}
