//! A one-way flag that threads can wait on (set once, never cleared).

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::lock;

#[derive(Debug, Default)]
pub struct Latch {
    set: Mutex<bool>,
    cv: Condvar,
}

impl Latch {
    pub fn set(&self) {
        *lock(&self.set) = true;
        self.cv.notify_all();
    }

    pub fn is_set(&self) -> bool {
        *lock(&self.set)
    }

    /// Waits until it is set or `at_most` has passed; whether it is set.
    pub fn wait(&self, at_most: Duration) -> bool {
        let deadline = Instant::now() + at_most;
        let mut set = lock(&self.set);
        while !*set {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            set = self
                .cv
                .wait_timeout(set, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn waits_until_set_or_the_time_is_up() {
        let l = Arc::new(Latch::default());
        assert!(!l.wait(Duration::from_millis(10)));
        let l2 = l.clone();
        let t = std::thread::spawn(move || l2.wait(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(20));
        l.set();
        assert!(t.join().unwrap());
        assert!(l.is_set() && l.wait(Duration::ZERO));
    }
}
