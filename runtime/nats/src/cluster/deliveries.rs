//! Consumers on a cluster: their specs and where each stands in each
//! thread, in two KV buckets every runtime node shares, so that any node
//! serves any consumer.
//!
//! - `ferry_consumers`: one entry per consumer (its name's key) holding
//!   its [`StoredConsumer`];
//! - `ferry_deliveries`: one entry per consumer and thread
//!   (`<generation>.<thread key>`) holding its [`DeliveryRecord`], event
//!   out included: a pull through one node and its acknowledgement
//!   through another are one delivery, and an event out on a node that
//!   died comes back on the others after its `ack_wait`.
//!
//! Every write of a record is a compare-and-set on the entry's revision,
//! so that two nodes never hand out one thread's events at once. A
//! consumer's generation (its name and when it was made) begins each of
//! its records' keys: a consumer deleted and made again under its name
//! never finds the records of the one before, even those a node wrote
//! while the delete was under way.

use std::collections::HashMap;
use std::sync::Mutex;

use async_nats::jetstream::{self, kv};
use async_trait::async_trait;
use bytes::Bytes;
use ferry_store::codec::{decode, encode};
use ferry_store::{DeliveryRecord, DeliveryStore, Error, StoredConsumer};
use futures::{Stream, StreamExt};

use super::kv::{bucket, key_of};

pub const CONSUMERS_BUCKET: &str = "ferry_consumers";
pub const DELIVERIES_BUCKET: &str = "ferry_deliveries";

/// The two buckets, and each consumer's generation as last read.
pub struct SharedDeliveries {
    consumers: kv::Store,
    records: kv::Store,
    generations: Mutex<HashMap<String, String>>,
}

/// A record as kept: with whose it is, so that a change read from the
/// bucket's feed says so.
#[derive(serde::Serialize, serde::Deserialize)]
struct Kept {
    consumer: String,
    generation: String,
    record: DeliveryRecord,
}

/// What another node (or this one) changed.
pub enum Change {
    /// A consumer was made or deleted.
    Consumers,
    /// A record was written.
    Record {
        consumer: String,
        record: DeliveryRecord,
    },
}

fn backend(e: impl std::fmt::Display) -> Error {
    Error::Unavailable(e.to_string())
}

fn generation_of(consumer: &StoredConsumer) -> String {
    key_of(&format!("{}\n{}", consumer.spec.name, consumer.created_at))
}

impl SharedDeliveries {
    /// Binds both buckets, making them on the first start.
    pub async fn attach(js: &jetstream::Context, replicas: usize) -> Result<Self, Error> {
        let forever = std::time::Duration::ZERO;
        Ok(Self {
            consumers: bucket(js, CONSUMERS_BUCKET, replicas, forever)
                .await
                .map_err(backend)?,
            records: bucket(js, DELIVERIES_BUCKET, replicas, forever)
                .await
                .map_err(backend)?,
            generations: Mutex::default(),
        })
    }

    /// Every change from now on, made by any node. A consumer's changes
    /// stop being reported once it is deleted here.
    pub async fn changes(&self) -> Result<impl Stream<Item = Change> + use<>, Error> {
        let consumers = self
            .consumers
            .watch_all()
            .await
            .map_err(backend)?
            .filter_map(|entry| async move { entry.ok().map(|_| Change::Consumers) });
        let records =
            self.records
                .watch_all()
                .await
                .map_err(backend)?
                .filter_map(|entry| async move {
                    let entry = entry.ok()?;
                    if entry.operation != kv::Operation::Put {
                        return None;
                    }
                    let mut kept: Kept = decode(&entry.value).ok()?;
                    kept.record.revision = entry.revision;
                    // A consumer made again under its name has a new
                    // generation: a record of the one before is no change.
                    let current = entry.key.starts_with(&format!("{}.", kept.generation));
                    current.then_some(Change::Record {
                        consumer: kept.consumer,
                        record: kept.record,
                    })
                });
        Ok(futures::stream::select(consumers, records))
    }

    /// The generation of consumer `name` as kept (`None`: there is none).
    async fn generation(&self, name: &str) -> Result<Option<String>, Error> {
        if let Some(generation) = self.generations.lock().expect("generations").get(name) {
            return Ok(Some(generation.clone()));
        }
        let Some(value) = self.consumers.get(key_of(name)).await.map_err(backend)? else {
            return Ok(None);
        };
        let stored: StoredConsumer = decode(&value)?;
        Ok(Some(self.remember(&stored)))
    }

    fn remember(&self, stored: &StoredConsumer) -> String {
        let generation = generation_of(stored);
        self.generations
            .lock()
            .expect("generations")
            .insert(stored.spec.name.clone(), generation.clone());
        generation
    }

    /// The keys of every record of `generation`.
    async fn keys_of(&self, generation: &str) -> Result<Vec<String>, Error> {
        let prefix = &self.records.prefix;
        let mut subjects = self
            .records
            .stream
            .info_with_subjects(format!("{prefix}{generation}.>"))
            .await
            .map_err(backend)?;
        let mut keys = vec![];
        while let Some(subject) = subjects.next().await {
            let (subject, _) = subject.map_err(backend)?;
            if let Some(key) = subject.strip_prefix(prefix.as_str()) {
                keys.push(key.to_owned());
            }
        }
        Ok(keys)
    }

    async fn read(&self, key: String) -> Result<Option<DeliveryRecord>, Error> {
        let Some(entry) = self.records.entry(key).await.map_err(backend)? else {
            return Ok(None);
        };
        if entry.operation != kv::Operation::Put {
            return Ok(None);
        }
        let mut kept: Kept = decode(&entry.value)?;
        kept.record.revision = entry.revision;
        Ok(Some(kept.record))
    }
}

#[async_trait]
impl DeliveryStore for SharedDeliveries {
    async fn create_consumer(
        &self,
        consumer: &StoredConsumer,
    ) -> Result<Option<StoredConsumer>, Error> {
        let key = key_of(&consumer.spec.name);
        match self.consumers.create(&key, encode(consumer).into()).await {
            Ok(_) => {
                self.remember(consumer);
                Ok(None)
            }
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let value = self.consumers.get(key).await.map_err(backend)?;
                let kept: StoredConsumer =
                    decode(&value.ok_or_else(|| backend("a consumer deleted while made again"))?)?;
                self.remember(&kept);
                Ok(Some(kept))
            }
            Err(e) => Err(backend(e)),
        }
    }

    async fn delete_consumer(&self, name: &str) -> Result<(), Error> {
        let Some(generation) = self.generation(name).await? else {
            return Ok(());
        };
        // The spec first: no node takes the consumer up again, and its
        // records left behind (by a failure here, or a node still writing)
        // are no other consumer's.
        self.consumers.purge(key_of(name)).await.map_err(backend)?;
        self.generations.lock().expect("generations").remove(name);
        for key in self.keys_of(&generation).await? {
            self.records.purge(key).await.map_err(backend)?;
        }
        Ok(())
    }

    async fn consumers(&self) -> Result<Vec<StoredConsumer>, Error> {
        let mut keys = self.consumers.keys().await.map_err(backend)?;
        let mut out = vec![];
        let mut generations = HashMap::new();
        while let Some(key) = keys.next().await {
            let key = key.map_err(backend)?;
            if let Some(value) = self.consumers.get(key).await.map_err(backend)? {
                let stored: StoredConsumer = decode(&value)?;
                generations.insert(stored.spec.name.clone(), generation_of(&stored));
                out.push(stored);
            }
        }
        *self.generations.lock().expect("generations") = generations;
        Ok(out)
    }

    async fn records(&self, name: &str) -> Result<Vec<DeliveryRecord>, Error> {
        let Some(generation) = self.generation(name).await? else {
            return Ok(vec![]);
        };
        let reads = self
            .keys_of(&generation)
            .await?
            .into_iter()
            .map(|key| self.read(key));
        let mut out = vec![];
        for record in futures::future::join_all(reads).await {
            out.extend(record?);
        }
        Ok(out)
    }

    async fn record(&self, name: &str, group_id: &str) -> Result<Option<DeliveryRecord>, Error> {
        let Some(generation) = self.generation(name).await? else {
            return Ok(None);
        };
        self.read(format!("{generation}.{}", key_of(group_id)))
            .await
    }

    async fn write_records(
        &self,
        name: &str,
        records: &[DeliveryRecord],
    ) -> Result<Vec<Option<u64>>, Error> {
        let generation = self
            .generation(name)
            .await?
            .ok_or_else(|| Error::Unavailable(format!("consumer {name:?} was deleted")))?;
        let writes = records.iter().map(|record| {
            let key = format!("{generation}.{}", key_of(&record.group_id));
            let value: Bytes = encode(&Kept {
                consumer: name.to_owned(),
                generation: generation.clone(),
                record: record.clone(),
            })
            .into();
            async move {
                if record.revision == 0 {
                    match self.records.create(&key, value).await {
                        Ok(revision) => Ok(Some(revision)),
                        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(None),
                        Err(e) => Err(backend(e)),
                    }
                } else {
                    match self.records.update(&key, value, record.revision).await {
                        Ok(revision) => Ok(Some(revision)),
                        Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => Ok(None),
                        Err(e) => Err(backend(e)),
                    }
                }
            }
        });
        futures::future::join_all(writes)
            .await
            .into_iter()
            .collect()
    }

    fn shares_outs(&self) -> bool {
        true
    }
}
