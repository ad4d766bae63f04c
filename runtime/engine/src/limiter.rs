//! Where rate-limit buckets are kept: the `Buckets` port, and `InMemory`
//! for one process (`ferry serve`). A cluster keeps them in JetStream KV
//! (`ferry-nats`), so that every node takes from the same buckets.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use crate::limits::{Bucket, Limit};
use crate::store;

/// Takes one token from each of a call's buckets, or none.
#[async_trait]
pub trait Buckets: Send + Sync + 'static {
    /// `Ok(Ok(()))`: a token taken from every bucket named. `Ok(Err(wait))`:
    /// one of them is empty for `wait` yet, and none was taken from.
    async fn take(
        &self,
        buckets: &[(String, Limit)],
        now: u64,
    ) -> Result<Result<(), Duration>, store::Error>;
}

/// Buckets past which full ones are forgotten (a full bucket is the same as
/// one never seen), so that memory follows the callers active lately.
const FORGET_FULL_PAST: usize = 100_000;

/// One process's buckets, exact: every bucket of a call is checked and
/// taken from under one lock.
#[derive(Default)]
pub struct InMemory {
    buckets: Mutex<HashMap<String, (Bucket, Limit)>>,
}

#[async_trait]
impl Buckets for InMemory {
    async fn take(
        &self,
        buckets: &[(String, Limit)],
        now: u64,
    ) -> Result<Result<(), Duration>, store::Error> {
        let mut held = self.buckets.lock().expect("buckets lock");
        let mut taken = Vec::with_capacity(buckets.len());
        for (key, limit) in buckets {
            let state = held.get(key).map(|(bucket, _)| *bucket);
            match Bucket::at(state, *limit, now).take(*limit) {
                Ok(after) => taken.push((key.clone(), after, *limit)),
                Err(wait) => return Ok(Err(wait)),
            }
        }
        for (key, bucket, limit) in taken {
            held.insert(key, (bucket, limit));
        }
        if held.len() > FORGET_FULL_PAST {
            held.retain(|_, (bucket, limit)| {
                !Bucket::at(Some(*bucket), *limit, now).is_full(*limit)
            });
        }
        Ok(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_takes_from_every_bucket_or_from_none() {
        let buckets = InMemory::default();
        let one = Limit {
            rate: 1.0,
            burst: 1,
        };
        let two = Limit {
            rate: 1.0,
            burst: 2,
        };
        let both = [("a".to_owned(), two), ("b".to_owned(), one)];
        assert_eq!(buckets.take(&both, 0).await.unwrap(), Ok(()));
        // `b` is empty: nothing is taken from `a` either.
        assert!(buckets.take(&both, 0).await.unwrap().is_err());
        let just_a = [("a".to_owned(), two)];
        assert_eq!(buckets.take(&just_a, 0).await.unwrap(), Ok(()));
        assert!(buckets.take(&just_a, 0).await.unwrap().is_err());
    }
}
