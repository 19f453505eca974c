//! Time as the core sees it: an offset from the gate's start.
//!
//! The core never reads a clock. Every call takes `now` as a [`Time`], and
//! every deadline it returns is a [`Time`]; the actors turn those into timers.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

use serde::{Serialize, Serializer};

/// A point on the gate's timeline, measured from the moment it started.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Time(Duration);

impl Time {
    /// The gate's start.
    pub const ZERO: Time = Time(Duration::ZERO);

    /// The point `offset` after the start.
    pub const fn from_offset(offset: Duration) -> Self {
        Time(offset)
    }

    /// The point `ms` milliseconds after the start.
    pub const fn from_millis(ms: u64) -> Self {
        Time(Duration::from_millis(ms))
    }

    /// How long after the start this point is.
    pub const fn offset(self) -> Duration {
        self.0
    }

    /// Whole milliseconds after the start, as the replay format prints it.
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }
}

impl Add<Duration> for Time {
    type Output = Time;
    fn add(self, rhs: Duration) -> Time {
        Time(self.0.saturating_add(rhs))
    }
}

impl Sub for Time {
    type Output = Duration;
    /// The time from `rhs` to `self`, zero when `rhs` is later.
    fn sub(self, rhs: Time) -> Duration {
        self.0.saturating_sub(rhs.0)
    }
}

impl fmt::Debug for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.0.as_secs_f64())
    }
}

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.0.as_secs_f64())
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(self.as_millis())
    }
}

impl<'de> serde::Deserialize<'de> for Time {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        u64::deserialize(deserializer).map(Time::from_millis)
    }
}
