//! The audit log on JetStream: stream `FERRY_AUDIT`, one message per entry
//! on `ferry.audit.<kind>`, its stream sequence the entry's number. Each
//! message carries the entry's key as `Nats-Msg-Id`, so a repeat of an
//! action within the stream's duplicate window ([`DUPLICATE_WINDOW`]) is
//! stored once.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishAckFuture, stream};
use async_nats::HeaderMap;
use ferry_proto::audit::{AuditEntry, AuditKind, AuditQuery, AuditRecord};
use ferry_proto::Timestamp;

use crate::store::{codec, Error};

pub const STREAM: &str = "FERRY_AUDIT";

/// How long JetStream remembers an entry's key: a retry after a crash
/// comes within seconds; a longer window costs the server memory for
/// every entry it holds.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(10 * 60);

fn subject(kind: AuditKind) -> String {
    format!("ferry.audit.{}", kind.name())
}

#[derive(Clone)]
pub struct AuditStream {
    js: jetstream::Context,
    stream: stream::Stream,
}

impl AuditStream {
    pub async fn connect(js: &jetstream::Context, replicas: usize) -> Result<Self, Error> {
        let stream = js
            .get_or_create_stream(stream::Config {
                name: STREAM.to_owned(),
                subjects: vec!["ferry.audit.*".to_owned()],
                storage: stream::StorageType::File,
                num_replicas: replicas,
                allow_direct: true,
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await
            .map_err(backend)?;
        Ok(Self {
            js: js.clone(),
            stream,
        })
    }

    /// Sends the entries; each future resolves once JetStream stored one
    /// (or knew its key already).
    pub async fn send(&self, entries: &[AuditEntry]) -> Result<Vec<PublishAckFuture>, Error> {
        let mut acks = Vec::with_capacity(entries.len());
        for entry in entries {
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, entry.key.as_str());
            let ack = self
                .js
                .publish_with_headers(subject(entry.kind), headers, codec::encode(entry).into())
                .await
                .map_err(backend)?;
            acks.push(ack);
        }
        Ok(acks)
    }

    /// Stores the entries, durable on return.
    pub async fn record(&self, entries: &[AuditEntry]) -> Result<(), Error> {
        confirm(self.send(entries).await?).await
    }

    pub async fn read(&self, query: &AuditQuery) -> Result<Vec<AuditRecord>, Error> {
        let filter = match query.kinds.as_slice() {
            [kind] => subject(*kind),
            _ => "ferry.audit.*".to_owned(),
        };
        let mut from = query.after;
        if let Some(at) = query.from {
            from = from.max(self.last_before(at).await?);
        }
        let mut out = vec![];
        while out.len() < query.limit {
            let message = match self
                .stream
                .direct_get_next_for_subject(filter.clone(), Some(from + 1))
                .await
            {
                Ok(message) => message,
                Err(e) if matches!(e.kind(), stream::DirectGetErrorKind::NotFound) => break,
                Err(e) => return Err(backend(e)),
            };
            from = message.sequence;
            let record = AuditRecord {
                seq: message.sequence,
                entry: codec::decode(&message.payload)?,
            };
            if query.wants(&record) {
                out.push(record);
            }
        }
        Ok(out)
    }

    /// The number of the last entry before `at` (0: none), by halving
    /// the log: entries are appended in about the order of their times
    /// (nodes' clocks may differ a little; `wants` filters the rest).
    async fn last_before(&self, at: Timestamp) -> Result<u64, Error> {
        let info = self.stream.get_info().await.map_err(backend)?;
        let (mut below, mut above) = (
            info.state.first_sequence.saturating_sub(1),
            info.state.last_sequence + 1,
        );
        while above - below > 1 {
            let middle = below + (above - below) / 2;
            let entry: AuditEntry = match self.stream.direct_get(middle).await {
                Ok(message) => codec::decode(&message.payload)?,
                Err(e) if matches!(e.kind(), stream::DirectGetErrorKind::NotFound) => {
                    below = middle;
                    continue;
                }
                Err(e) => return Err(backend(e)),
            };
            if entry.at < at {
                below = middle;
            } else {
                above = middle;
            }
        }
        Ok(below)
    }
}

/// Waits for JetStream to store every entry sent.
pub async fn confirm(acks: Vec<PublishAckFuture>) -> Result<(), Error> {
    for ack in acks {
        ack.await.map_err(backend)?;
    }
    Ok(())
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(e.to_string())
}
