//! Rate-limited log lines: a misconfigured node retrying ten times a
//! second must say so once in a while, not fill the logs.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// How often one kind of line is logged at most.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Lets one line through per `every`, counting those held back.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    /// At most one line per `every`.
    pub fn new(every: Duration) -> Self {
        Throttle {
            every,
            last: None,
            held: 0,
        }
    }

    /// `Some(held back since the last line)` when a line may go out now.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < self.every => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

/// One [`Throttle`] per key (a peer address, a node), at most `capacity`
/// keys: when full, the oldest are forgotten, so a flood of sources costs
/// bounded memory.
#[derive(Debug)]
pub struct Throttles<K> {
    every: Duration,
    capacity: usize,
    each: HashMap<K, Throttle>,
}

impl<K: Hash + Eq + Clone> Throttles<K> {
    /// At most one line per key per `every`, for up to `capacity` keys.
    pub fn new(every: Duration, capacity: usize) -> Self {
        Throttles {
            every,
            capacity,
            each: HashMap::new(),
        }
    }

    /// As [`Throttle::allow`], for `key`.
    pub fn allow(&mut self, key: &K, now: Instant) -> Option<u64> {
        if !self.each.contains_key(key) && self.each.len() >= self.capacity {
            let every = self.every;
            self.each
                .retain(|_, t| t.last.is_some_and(|l| now.duration_since(l) < every));
            if self.each.len() >= self.capacity {
                self.each.clear();
            }
        }
        let every = self.every;
        self.each
            .entry(key.clone())
            .or_insert_with(|| Throttle::new(every))
            .allow(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let start = Instant::now();
        let mut throttle = Throttle::new(Duration::from_secs(10));
        assert_eq!(throttle.allow(start), Some(0));
        for ms in 1..100 {
            assert_eq!(throttle.allow(start + Duration::from_millis(ms)), None);
        }
        assert_eq!(throttle.allow(start + Duration::from_secs(10)), Some(99));
    }

    #[test]
    fn keys_are_throttled_apart_and_bounded() {
        let now = Instant::now();
        let mut throttles = Throttles::new(Duration::from_secs(10), 4);
        assert_eq!(throttles.allow(&1, now), Some(0));
        assert_eq!(throttles.allow(&1, now), None);
        assert_eq!(throttles.allow(&2, now), Some(0));
        for key in 3..1000 {
            throttles.allow(&key, now);
        }
        assert!(throttles.each.len() <= 4);
    }
}
