//! Points in time as Ferry records them: [`Timestamp`], to the millisecond,
//! for when something happened, and [`Deadline`], to the second, for when
//! an approval times out.
//!
//! Both travel and are stored as RFC 3339 UTC strings, so a value reads
//! the same in JSON, in MessagePack and in a log line. Neither reads the
//! clock: whoever needs the current time converts a [`SystemTime`].

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The last second RFC 3339 can write with a four-digit year
/// (`9999-12-31T23:59:59Z`). Values are held at or below it, so that
/// formatting one never fails.
const MAX_SECS: u64 = 253_402_300_799;

/// A string that is not an RFC 3339 UTC time (`2026-11-29T00:00:00.123Z`,
/// any number of fractional digits or none, `Z` or `+00:00`, year 1970 to
/// 9999).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("not an RFC 3339 UTC time: {0}")]
pub struct ParseTimeError(humantime::TimestampError);

/// A point in time to the millisecond, on or after the Unix epoch.
///
/// Written as RFC 3339 UTC with exactly three fractional digits
/// (`2026-11-29T00:00:00.123Z`); read from any RFC 3339 UTC string, with
/// or without a fraction (digits past the millisecond are dropped). The
/// order is the order in time.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Timestamp {
    millis: u64,
}

impl Timestamp {
    /// 1970-01-01T00:00:00.000Z; also the [`Default`], what a record that
    /// has seen no event yet holds.
    pub const UNIX_EPOCH: Self = Self { millis: 0 };

    /// The latest time RFC 3339 writes with a four-digit year.
    pub const MAX: Self = Self {
        millis: MAX_SECS * 1000 + 999,
    };

    /// `millis` milliseconds after the epoch, at most [`Timestamp::MAX`].
    pub const fn from_millis(millis: u64) -> Self {
        if millis > Self::MAX.millis {
            Self::MAX
        } else {
            Self { millis }
        }
    }

    /// Milliseconds since the epoch.
    pub const fn as_millis(self) -> u64 {
        self.millis
    }

    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.millis)
    }

    /// `duration` later, at most [`Timestamp::MAX`].
    pub fn saturating_add(self, duration: Duration) -> Self {
        let added = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self::from_millis(self.millis.saturating_add(added))
    }

    /// `duration` earlier, at the earliest the epoch.
    pub fn saturating_sub(self, duration: Duration) -> Self {
        let taken = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        Self::from_millis(self.millis.saturating_sub(taken))
    }

    /// How long after `earlier` this is; `None` if it is before it.
    pub fn duration_since(self, earlier: Self) -> Option<Duration> {
        self.millis
            .checked_sub(earlier.millis)
            .map(Duration::from_millis)
    }
}

impl From<SystemTime> for Timestamp {
    /// Truncated to the millisecond; a time before the epoch is the epoch.
    fn from(time: SystemTime) -> Self {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        Self::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

impl From<Timestamp> for SystemTime {
    fn from(at: Timestamp) -> Self {
        at.to_system_time()
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_rfc3339_millis(self.to_system_time()).fmt(f)
    }
}

impl FromStr for Timestamp {
    type Err = ParseTimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_rfc3339(s)
            .map(Self::from)
            .map_err(ParseTimeError)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_str(Rfc3339)?
            .parse::<Self>()
            .map_err(serde::de::Error::custom)
    }
}

/// When a pending approval is rejected automatically: a whole second.
///
/// Written as RFC 3339 UTC without a fraction (`2099-01-01T00:00:00Z`);
/// read from any RFC 3339 UTC string, a fraction rounded up to the next
/// second. Rounded up, never down: a deadline moved earlier could leave a
/// reviewer of a one-second timeout no time at all.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Deadline {
    secs: u64,
}

impl Deadline {
    /// `secs` seconds after the epoch, at most `9999-12-31T23:59:59Z`.
    pub const fn from_secs(secs: u64) -> Self {
        Self {
            secs: if secs > MAX_SECS { MAX_SECS } else { secs },
        }
    }

    /// The first whole second at or after `time` (the epoch for a time
    /// before it).
    pub fn at_or_after(time: SystemTime) -> Self {
        let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
        let secs = since.as_secs() + u64::from(since.subsec_nanos() > 0);
        Self::from_secs(secs)
    }

    /// Seconds since the epoch.
    pub const fn as_secs(self) -> u64 {
        self.secs
    }

    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.secs)
    }
}

impl From<Deadline> for SystemTime {
    fn from(deadline: Deadline) -> Self {
        deadline.to_system_time()
    }
}

impl From<Deadline> for Timestamp {
    fn from(deadline: Deadline) -> Self {
        Self::from_millis(deadline.secs * 1000)
    }
}

impl fmt::Display for Deadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_rfc3339_seconds(self.to_system_time()).fmt(f)
    }
}

impl FromStr for Deadline {
    type Err = ParseTimeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_rfc3339(s)
            .map(Self::at_or_after)
            .map_err(ParseTimeError)
    }
}

impl Serialize for Deadline {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Deadline {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_str(Rfc3339)?
            .parse::<Self>()
            .map_err(serde::de::Error::custom)
    }
}

/// Reads a string, borrowed where the format lets it be, so that parsing
/// a time allocates nothing.
struct Rfc3339;

impl<'de> serde::de::Visitor<'de> for Rfc3339 {
    type Value = RawTime<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an RFC 3339 UTC time")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(RawTime::Borrowed(v))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(RawTime::Owned(v.to_owned()))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(RawTime::Owned(v))
    }
}

enum RawTime<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl RawTime<'_> {
    fn parse<T: FromStr>(&self) -> Result<T, T::Err> {
        match self {
            Self::Borrowed(s) => s.parse(),
            Self::Owned(s) => s.parse(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_writes_exactly_three_fractional_digits() {
        let at = Timestamp::from_millis(1_795_910_400_123);
        assert_eq!(at.to_string(), "2026-11-29T00:00:00.123Z");
        assert_eq!(
            serde_json::to_string(&at).unwrap(),
            "\"2026-11-29T00:00:00.123Z\""
        );
        assert_eq!(
            Timestamp::from_millis(0).to_string(),
            "1970-01-01T00:00:00.000Z"
        );
        let read: Timestamp = serde_json::from_str("\"2026-11-29T00:00:00.123Z\"").unwrap();
        assert_eq!(read, at);
        assert_eq!(read.as_millis(), 1_795_910_400_123);
    }

    /// The string is the one `humantime` writes for the same time, which
    /// is what every stored and sent value holds.
    #[test]
    fn a_timestamp_writes_what_humantime_writes() {
        let time = UNIX_EPOCH + Duration::new(1_795_910_400, 123_456_789);
        assert_eq!(
            Timestamp::from(time).to_string(),
            humantime::format_rfc3339_millis(time).to_string()
        );
    }

    #[test]
    fn a_timestamp_reads_any_number_of_fractional_digits() {
        let whole = 1_795_910_400_000;
        assert_eq!(
            "2026-11-29T00:00:00Z".parse::<Timestamp>().unwrap(),
            Timestamp::from_millis(whole)
        );
        let cases = [
            ("1", 100),
            ("12", 120),
            ("123", 123),
            ("1234", 123),
            ("12345", 123),
            ("123456", 123),
            ("1234567", 123),
            ("12345678", 123),
            ("123456789", 123),
        ];
        for (fraction, millis) in cases {
            let text = format!("2026-11-29T00:00:00.{fraction}Z");
            let at: Timestamp = text.parse().unwrap();
            assert_eq!(at, Timestamp::from_millis(whole + millis), "{text}");
            let read: Timestamp = serde_json::from_value(text.clone().into()).unwrap();
            assert_eq!(read, at, "{text}");
        }
        assert_eq!(
            "2026-11-29T00:00:00.5+00:00".parse::<Timestamp>().unwrap(),
            Timestamp::from_millis(whole + 500)
        );
    }

    #[test]
    fn garbage_is_refused() {
        for text in [
            "t",
            "",
            "2026-13-01T00:00:00Z",
            "2026-11-29 00:00:00",
            "1969-12-31T23:59:59Z",
        ] {
            assert!(text.parse::<Timestamp>().is_err(), "{text:?}");
            assert!(text.parse::<Deadline>().is_err(), "{text:?}");
            let json = serde_json::Value::from(text);
            assert!(
                serde_json::from_value::<Timestamp>(json.clone()).is_err(),
                "{text:?}"
            );
            assert!(
                serde_json::from_value::<Deadline>(json).is_err(),
                "{text:?}"
            );
        }
        assert!(serde_json::from_str::<Timestamp>("0").is_err());
        let error = "t".parse::<Timestamp>().unwrap_err();
        assert!(
            error.to_string().starts_with("not an RFC 3339 UTC time"),
            "{error}"
        );
    }

    #[test]
    fn a_deadline_writes_whole_seconds() {
        let deadline: Deadline = "2099-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(deadline.to_string(), "2099-01-01T00:00:00Z");
        assert_eq!(
            serde_json::to_string(&deadline).unwrap(),
            "\"2099-01-01T00:00:00Z\""
        );
        let read: Deadline = serde_json::from_str("\"2099-01-01T00:00:00.000Z\"").unwrap();
        assert_eq!(read, deadline);
        assert_eq!(
            Deadline::at_or_after(deadline.to_system_time()),
            deadline,
            "a whole second stays"
        );
    }

    /// A fraction rounds up, never down: the deadline is never earlier
    /// than the time it was made from.
    #[test]
    fn a_deadline_rounds_a_fraction_up() {
        let read: Deadline = "2099-01-01T00:00:00.001Z".parse().unwrap();
        assert_eq!(read.to_string(), "2099-01-01T00:00:01Z");
        let time = UNIX_EPOCH + Duration::new(4_070_908_800, 1);
        let deadline = Deadline::at_or_after(time);
        assert!(deadline.to_system_time() >= time);
        assert_eq!(deadline.as_secs(), 4_070_908_801);
    }

    #[test]
    fn the_order_is_the_order_in_time() {
        let earlier: Timestamp = "2026-11-29T00:00:00.999Z".parse().unwrap();
        let later: Timestamp = "2026-11-29T00:00:01Z".parse().unwrap();
        assert!(earlier < later);
        assert!("2026-11-28T23:59:59.999Z".parse::<Timestamp>().unwrap() < earlier);
        assert_eq!(
            later.duration_since(earlier),
            Some(Duration::from_millis(1))
        );
        assert_eq!(earlier.duration_since(later), None);
        assert_eq!(earlier.saturating_add(Duration::from_millis(1)), later);
        assert_eq!(later.saturating_sub(Duration::from_millis(1)), earlier);
        let soon = Deadline::from_secs(10);
        assert!(soon < Deadline::from_secs(11));
        assert!(Timestamp::from(soon) < Timestamp::from(Deadline::from_secs(11)));
    }

    /// Values past year 9999 are held at its end, where RFC 3339 can still
    /// write them, and times before the epoch at the epoch.
    #[test]
    fn out_of_range_values_saturate() {
        assert_eq!(Timestamp::from_millis(u64::MAX), Timestamp::MAX);
        assert_eq!(Timestamp::MAX.to_string(), "9999-12-31T23:59:59.999Z");
        assert_eq!(Timestamp::MAX.saturating_add(Duration::MAX), Timestamp::MAX);
        assert_eq!(
            Timestamp::from_millis(5).saturating_sub(Duration::MAX),
            Timestamp::UNIX_EPOCH
        );
        let before = UNIX_EPOCH - Duration::from_secs(1);
        assert_eq!(Timestamp::from(before), Timestamp::UNIX_EPOCH);
        assert_eq!(
            Deadline::from_secs(u64::MAX).to_string(),
            "9999-12-31T23:59:59Z"
        );
    }

    /// In MessagePack, as the stores keep them, both stay strings.
    #[test]
    fn stored_values_are_strings() {
        let at = Timestamp::from_millis(1_795_910_400_123);
        let bytes = rmp_serde::to_vec_named(&at).unwrap();
        assert_eq!(
            bytes,
            rmp_serde::to_vec_named("2026-11-29T00:00:00.123Z").unwrap()
        );
        assert_eq!(rmp_serde::from_slice::<Timestamp>(&bytes).unwrap(), at);
        let deadline = Deadline::from_secs(4_070_908_800);
        let bytes = rmp_serde::to_vec_named(&deadline).unwrap();
        assert_eq!(
            bytes,
            rmp_serde::to_vec_named("2099-01-01T00:00:00Z").unwrap()
        );
        assert_eq!(rmp_serde::from_slice::<Deadline>(&bytes).unwrap(), deadline);
    }
}
