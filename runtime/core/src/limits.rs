//! Rate limits: token buckets (a rate a second and a burst), kept per
//! identity, per `user_id` and per tool, set for every call and per
//! toolset. The arithmetic is here; where a bucket is kept (in memory, or
//! in JetStream KV so that every node shares it) is the engine's.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most a limit's rate or burst may be.
pub const MAX_RATE: f64 = 1_000_000.0;

/// `rate` calls a second on average, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limit {
    pub rate: f64,
    pub burst: u32,
}

impl Limit {
    pub fn check(&self) -> Result<(), String> {
        if !(self.rate.is_finite() && self.rate > 0.0 && self.rate <= MAX_RATE) {
            return Err(format!(
                "a rate limit's rate must be above 0 and at most {MAX_RATE} a second (got {})",
                self.rate
            ));
        }
        if self.burst == 0 || f64::from(self.burst) > MAX_RATE {
            return Err(format!(
                "a rate limit's burst must be 1 to {MAX_RATE} (got {})",
                self.burst
            ));
        }
        Ok(())
    }
}

/// `RATE:BURST`, as the command line takes it (`10:20`).
impl std::str::FromStr for Limit {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let shape =
            || format!("{text:?} is not RATE:BURST (calls a second, then how many at once: 10:20)");
        let (rate, burst) = text.split_once(':').ok_or_else(shape)?;
        let limit = Limit {
            rate: rate.trim().parse().map_err(|_| shape())?,
            burst: burst.trim().parse().map_err(|_| shape())?,
        };
        limit.check()?;
        Ok(limit)
    }
}

/// The limits one scope of configuration sets: every call's, or a
/// toolset's calls'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    /// Per identity (the credential that submits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Limit>,
    /// Per `user_id` (calls naming none are not counted here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<Limit>,
    /// Per tool (`Toolset.tool`, every version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<Limit>,
}

impl RateLimits {
    pub fn is_empty(&self) -> bool {
        self == &RateLimits::default()
    }

    pub fn check(&self) -> Result<(), String> {
        [self.identity, self.user, self.tool]
            .iter()
            .flatten()
            .try_for_each(Limit::check)
    }

    /// The buckets a call takes a token from, as `(key, limit)`: `scope`
    /// keeps one configuration's buckets apart from another's.
    pub fn buckets(
        &self,
        scope: &str,
        identity: &str,
        user: Option<&str>,
        tool: &str,
    ) -> Vec<(String, Limit)> {
        let mut keys = vec![];
        if let Some(limit) = self.identity {
            keys.push((format!("{scope}\0identity\0{identity}"), limit));
        }
        if let (Some(limit), Some(user)) = (self.user, user) {
            keys.push((format!("{scope}\0user\0{user}"), limit));
        }
        if let Some(limit) = self.tool {
            keys.push((format!("{scope}\0tool\0{tool}"), limit));
        }
        keys
    }
}

/// A bucket's state: the tokens it held at `at` (milliseconds since the
/// epoch). A bucket never seen is full.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    pub tokens: f64,
    pub at: u64,
}

impl Bucket {
    /// The bucket as of `now`: refilled at the limit's rate, up to its
    /// burst (a clock that went back refills nothing).
    pub fn at(state: Option<Bucket>, limit: Limit, now: u64) -> Bucket {
        let burst = f64::from(limit.burst);
        match state {
            None => Bucket {
                tokens: burst,
                at: now,
            },
            Some(b) => {
                let elapsed = now.saturating_sub(b.at) as f64 / 1000.0;
                Bucket {
                    tokens: (b.tokens + elapsed * limit.rate).min(burst),
                    at: now.max(b.at),
                }
            }
        }
    }

    /// One token taken, or how long until there is one.
    pub fn take(self, limit: Limit) -> Result<Bucket, Duration> {
        if self.tokens >= 1.0 {
            Ok(Bucket {
                tokens: self.tokens - 1.0,
                ..self
            })
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / limit.rate))
        }
    }

    /// Whether the bucket is as good as never seen (full): it need not be
    /// kept.
    pub fn is_full(&self, limit: Limit) -> bool {
        self.tokens >= f64::from(limit.burst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEN_A_SECOND: Limit = Limit {
        rate: 10.0,
        burst: 20,
    };

    #[test]
    fn a_burst_then_the_rate() {
        let mut bucket = Bucket::at(None, TEN_A_SECOND, 1_000);
        for _ in 0..20 {
            bucket = bucket.take(TEN_A_SECOND).expect("within the burst");
        }
        let wait = bucket.take(TEN_A_SECOND).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100));
        // 250 ms later: two tokens and a half.
        let later = Bucket::at(Some(bucket), TEN_A_SECOND, 1_250);
        let later = later
            .take(TEN_A_SECOND)
            .unwrap()
            .take(TEN_A_SECOND)
            .unwrap();
        assert!(later.take(TEN_A_SECOND).is_err());
        // Never past the burst, and a clock that went back adds nothing.
        let full = Bucket::at(Some(later), TEN_A_SECOND, 1_000_000);
        assert_eq!(full.tokens, 20.0);
        assert!(full.is_full(TEN_A_SECOND));
        let back = Bucket::at(Some(bucket), TEN_A_SECOND, 500);
        assert_eq!(back.tokens, bucket.tokens);
    }

    #[test]
    fn limits_are_read_and_checked() {
        assert_eq!("10:20".parse::<Limit>(), Ok(TEN_A_SECOND));
        assert_eq!(
            "0.5:1".parse::<Limit>(),
            Ok(Limit {
                rate: 0.5,
                burst: 1
            })
        );
        for bad in [
            "10", "10:", ":20", "0:20", "-1:5", "10:0", "NaN:5", "inf:5", "10:-1", "10:2.5",
        ] {
            assert!(bad.parse::<Limit>().is_err(), "{bad}");
        }
        let limits: RateLimits =
            serde_json::from_value(serde_json::json!({"user": {"rate": 1, "burst": 2}})).unwrap();
        assert_eq!(limits.buckets("all", "agent", None, "T.t"), vec![]);
        assert_eq!(limits.buckets("all", "agent", Some("u1"), "T.t").len(), 1);
        assert!(serde_json::from_value::<RateLimits>(serde_json::json!({"users": {}})).is_err());
    }
}
