//! What every process of one cluster must agree on, kept in the KV bucket
//! `ferry_cluster`: the fingerprint of the callback secret
//! (`token::Capabilities::fingerprint`, never the secret) and the number
//! of partitions the thread logs are spread over. The first process to
//! join records them; every later one compares, and one that differs
//! refuses to start. A worker with another secret would otherwise send
//! tools callback URLs that every node refuses, and its calls would wait
//! for good; a process with another partition count would look for
//! threads in the wrong stream.

use async_nats::jetstream::{self, kv};

pub const BUCKET: &str = "ferry_cluster";
const SECRET_KEY: &str = "secret-fingerprint";
const PARTITIONS_KEY: &str = "partitions";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "this process's --secret is not the cluster's (the fingerprint in JetStream KV \
         {BUCKET:?} differs): the tools' callbacks of its calls would all be refused; \
         give it the secret every other node and worker has"
    )]
    SecretDiffers,
    #[error(
        "this process was started with --partitions {ours}, but the cluster's thread logs \
         are spread over {theirs} (JetStream KV {BUCKET:?}): the count is fixed when the \
         streams are made; start it with --partitions {theirs}"
    )]
    PartitionsDiffer { ours: usize, theirs: usize },
    #[error("NATS JetStream: {0}")]
    Nats(String),
}

impl Error {
    /// Whether trying again can change it (NATS not ready yet, say).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Nats(_))
    }
}

fn nats(e: impl std::fmt::Display) -> Error {
    Error::Nats(e.to_string())
}

/// Records `fingerprint` and `partitions` if this is the cluster's first
/// process, else checks them against what the first one recorded.
pub async fn join(
    js: &jetstream::Context,
    replicas: usize,
    fingerprint: &str,
    partitions: usize,
) -> Result<(), Error> {
    let bucket = super::kv::bucket(js, BUCKET, replicas, std::time::Duration::ZERO)
        .await
        .map_err(nats)?;
    if agreed(&bucket, SECRET_KEY, fingerprint).await? != fingerprint {
        return Err(Error::SecretDiffers);
    }
    let ours = partitions.to_string();
    let theirs = agreed(&bucket, PARTITIONS_KEY, &ours).await?;
    if theirs != ours {
        return Err(Error::PartitionsDiffer {
            ours: partitions,
            theirs: theirs.parse().unwrap_or(0),
        });
    }
    Ok(())
}

/// The value the cluster keeps under `key`: `ours` if no process recorded
/// one before (create-if-absent, so two first processes cannot both win).
async fn agreed(bucket: &kv::Store, key: &str, ours: &str) -> Result<String, Error> {
    match bucket.create(key, ours.to_owned().into()).await {
        Ok(_) => return Ok(ours.to_owned()),
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
        Err(e) => return Err(nats(e)),
    }
    let kept = bucket.get(key).await.map_err(nats)?.unwrap_or_default();
    Ok(String::from_utf8_lossy(&kept).into_owned())
}
