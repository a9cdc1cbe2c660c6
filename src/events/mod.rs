//! Container and pod lifecycle events (CRI `GetContainerEvents`, kubelet's evented PLEG).
//!
//! The lifecycle code publishes an [`Event`] after each transition (created, started,
//! stopped, deleted — of a container, or of a pod with the pod's id as `container_id`, as
//! CRI-O does), carrying the pod's status and every container status at that moment. Each
//! subscriber has its own queue of at most `backlog` events and `max_bytes` of them (an
//! event of a pod of many containers, each with large annotations, is big): one that stops
//! reading is cut off when its queue is full (its queue is freed at once and its stream ends with an error),
//! so a stalled client never grows the daemon's memory and never slows the others.
//!
//! Exits that happened while the daemon was down are folded in during restore; the events
//! that produces are kept (bounded) until the first subscriber connects, which gets them
//! before any live event — sent once, not replayed to later subscribers.
//!
//! Exits are learned without polling: [`watch::ExitWatcher`] has inotify watch each
//! container's dir for the monitor's exit file.

#[doc(hidden)]
pub mod watch;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::model::container::ContainerRecord;
use crate::model::sandbox::SandboxStatus;
use crate::state::lock;

/// Which transition an event reports (CRI's `ContainerEventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// A container was created, or a pod sandbox was run (followed by `Started`).
    Created,
    /// A container started, or a pod sandbox became ready.
    Started,
    /// A container exited or failed to start, or a pod sandbox was stopped.
    Stopped,
    /// A container or pod sandbox was removed.
    Deleted,
}

/// One transition, with the pod's state right after it.
#[derive(Debug, Clone)]
pub struct Event {
    /// Which transition (CRI `container_event_type`).
    pub kind: EventKind,
    /// The container's id, or the pod's for a pod event.
    pub container_id: String,
    /// When it happened (Unix nanoseconds).
    pub created_at: i64,
    /// The pod's status (its last one, for a pod that was just removed).
    pub sandbox: Option<SandboxStatus>,
    /// Every container of the pod as recorded right after the transition.
    pub containers: Vec<ContainerRecord>,
}

/// Why a subscription ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The subscriber fell `backlog` events behind and was cut off.
    FellBehind {
        /// The queue limit it overran (`events_backlog`).
        backlog: usize,
    },
    /// The events it had not read came to more than `bytes` (`events_backlog_bytes`).
    FellBehindBytes {
        /// The limit it overran.
        bytes: usize,
    },
    /// The runtime is going away.
    Closed,
}

struct Queue {
    /// Each with its size as [`approx_bytes`] counted it when it was published.
    events: VecDeque<(Arc<Event>, usize)>,
    /// What `events` come to.
    bytes: usize,
    ended: Option<Ended>,
}

impl Queue {
    fn pop(&mut self) -> Option<Arc<Event>> {
        let (e, size) = self.events.pop_front()?;
        self.bytes = self.bytes.saturating_sub(size);
        Some(e)
    }
}

/// What an event holds, roughly (strings and entries counted, fixed parts estimated): what a
/// subscriber's queue is bounded by besides its length.
pub fn approx_bytes(e: &Event) -> usize {
    fn map(m: &std::collections::BTreeMap<String, String>) -> usize {
        m.iter().map(|(k, v)| k.len() + v.len() + 48).sum()
    }
    let pod = e
        .sandbox
        .as_ref()
        .map_or(0, |s| 1024 + map(&s.labels) + map(&s.annotations));
    let containers: usize = e
        .containers
        .iter()
        .map(|r| {
            let c = &r.config;
            2048 + map(&c.labels)
                + map(&c.annotations)
                + c.envs
                    .iter()
                    .map(|(k, v)| k.len() + v.len() + 48)
                    .sum::<usize>()
                + c.command
                    .iter()
                    .chain(&c.args)
                    .map(|a| a.len() + 24)
                    .sum::<usize>()
                + c.mounts.len() * 512
                + r.message.len()
                + r.reason.len()
        })
        .sum();
    256 + e.container_id.len() + pod + containers
}

struct Subscriber {
    id: u64,
    queue: Mutex<Queue>,
    wake: tokio::sync::Notify,
}

struct Inner {
    subscribers: Vec<Arc<Subscriber>>,
    next_id: u64,
    /// Events from restore, kept for the first subscriber (`None` once handed over).
    startup: Option<VecDeque<(Arc<Event>, usize)>>,
}

/// The fan-out of events to subscribers.
pub struct Hub {
    inner: Mutex<Inner>,
    /// Subscribers + (1 while restoring): publishers skip building an event when zero.
    listeners: AtomicUsize,
    restoring: AtomicBool,
    backlog: usize,
    max_subscribers: usize,
    max_bytes: usize,
}

impl Hub {
    /// The same hub with each subscriber's queue also bounded to `bytes` of events.
    pub fn with_max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes.max(1);
        self
    }

    /// A hub that keeps at most `backlog` undelivered events per subscriber and accepts at
    /// most `max_subscribers` at once. It starts in restore mode (see [`Hub::restored`]).
    pub fn new(backlog: usize, max_subscribers: usize) -> Self {
        Hub {
            inner: Mutex::new(Inner {
                subscribers: Vec::new(),
                next_id: 0,
                startup: Some(VecDeque::new()),
            }),
            listeners: AtomicUsize::new(1),
            restoring: AtomicBool::new(true),
            backlog: backlog.max(1),
            max_subscribers,
            max_bytes: usize::MAX,
        }
    }

    /// Whether anyone would receive an event now (cheap; publishers check it first).
    pub fn wanted(&self) -> bool {
        self.listeners.load(Ordering::Acquire) > 0
    }

    /// Restore is over: events from now on go to subscribers only.
    pub fn restored(&self) {
        if self.restoring.swap(false, Ordering::AcqRel) {
            self.listeners.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Queues `event` for every subscriber; a subscriber whose queue is full is cut off.
    pub fn publish(&self, event: Event) {
        let size = approx_bytes(&event);
        let event = Arc::new(event);
        let mut inner = lock(&self.inner);
        if self.restoring.load(Ordering::Acquire) {
            if let Some(s) = inner.startup.as_mut() {
                if s.len() < self.backlog {
                    s.push_back((event.clone(), size));
                } else {
                    tracing::warn!(
                        container_id = %event.container_id,
                        "too many events during restore; dropping one (the client relists)"
                    );
                }
            }
        }
        let (backlog, max_bytes) = (self.backlog, self.max_bytes);
        let before = inner.subscribers.len();
        inner.subscribers.retain(|s| {
            let mut q = lock(&s.queue);
            let over = if q.events.len() >= backlog {
                Some(Ended::FellBehind { backlog })
            } else if q.bytes + size > max_bytes && !q.events.is_empty() {
                Some(Ended::FellBehindBytes { bytes: max_bytes })
            } else {
                None
            };
            if let Some(over) = over {
                q.events = VecDeque::new();
                q.bytes = 0;
                q.ended = Some(over);
                drop(q);
                s.wake.notify_one();
                tracing::warn!(
                    subscriber = s.id,
                    backlog,
                    "event subscriber stopped reading; disconnecting it"
                );
                return false;
            }
            q.events.push_back((event.clone(), size));
            q.bytes += size;
            drop(q);
            s.wake.notify_one();
            true
        });
        let cut = before - inner.subscribers.len();
        if cut > 0 {
            self.listeners.fetch_sub(cut, Ordering::AcqRel);
        }
    }

    /// A new subscription; `None` when `max_subscribers` are already connected.
    pub fn subscribe(self: &Arc<Self>) -> Option<Subscription> {
        let mut inner = lock(&self.inner);
        if inner.subscribers.len() >= self.max_subscribers {
            return None;
        }
        let id = inner.next_id;
        inner.next_id += 1;
        let events = inner.startup.take().unwrap_or_default();
        let bytes = events.iter().map(|(_, size)| size).sum();
        let sub = Arc::new(Subscriber {
            id,
            queue: Mutex::new(Queue {
                events,
                bytes,
                ended: None,
            }),
            wake: tokio::sync::Notify::new(),
        });
        inner.subscribers.push(sub.clone());
        self.listeners.fetch_add(1, Ordering::AcqRel);
        Some(Subscription {
            hub: Arc::downgrade(self),
            sub,
        })
    }

    /// Ends every subscription (the runtime is shutting down).
    pub fn close(&self) {
        let mut inner = lock(&self.inner);
        for s in inner.subscribers.drain(..) {
            lock(&s.queue).ended.get_or_insert(Ended::Closed);
            s.wake.notify_one();
            self.listeners.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Connected subscribers.
    pub fn subscribers(&self) -> usize {
        lock(&self.inner).subscribers.len()
    }

    fn unsubscribe(&self, id: u64) {
        let mut inner = lock(&self.inner);
        let before = inner.subscribers.len();
        inner.subscribers.retain(|s| s.id != id);
        if inner.subscribers.len() < before {
            self.listeners.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// One subscriber's view: events in publication order. Dropping it unsubscribes.
pub struct Subscription {
    hub: std::sync::Weak<Hub>,
    sub: Arc<Subscriber>,
}

impl Subscription {
    /// The next event; `Err` once the subscription has ended (after every queued event).
    pub async fn next(&self) -> Result<Arc<Event>, Ended> {
        loop {
            let notified = self.sub.wake.notified();
            {
                let mut q = lock(&self.sub.queue);
                if let Some(e) = q.pop() {
                    return Ok(e);
                }
                if let Some(end) = &q.ended {
                    return Err(end.clone());
                }
            }
            notified.await;
        }
    }

    /// The next event if one is queued now.
    pub fn try_next(&self) -> Option<Result<Arc<Event>, Ended>> {
        let mut q = lock(&self.sub.queue);
        match q.pop() {
            Some(e) => Some(Ok(e)),
            None => q.ended.clone().map(Err),
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.unsubscribe(self.sub.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: &str) -> Event {
        Event {
            kind: EventKind::Started,
            container_id: id.into(),
            created_at: 0,
            sandbox: None,
            containers: Vec::new(),
        }
    }

    #[test]
    fn every_subscriber_gets_every_event_in_order() {
        let hub = Arc::new(Hub::new(16, 4));
        hub.restored();
        assert!(!hub.wanted());
        let a = hub.subscribe().unwrap();
        let b = hub.subscribe().unwrap();
        assert!(hub.wanted());
        for i in 0..5 {
            hub.publish(ev(&i.to_string()));
        }
        for s in [&a, &b] {
            let got: Vec<String> = (0..5)
                .map(|_| s.try_next().unwrap().unwrap().container_id.clone())
                .collect();
            assert_eq!(got, ["0", "1", "2", "3", "4"]);
            assert!(s.try_next().is_none());
        }
        drop(a);
        drop(b);
        assert!(!hub.wanted());
        assert_eq!(hub.subscribers(), 0);
    }

    #[test]
    fn a_subscriber_that_stops_reading_is_cut_off_and_freed() {
        let hub = Arc::new(Hub::new(3, 4));
        hub.restored();
        let slow = hub.subscribe().unwrap();
        let fast = hub.subscribe().unwrap();
        for i in 0..10 {
            hub.publish(ev(&i.to_string()));
            assert_eq!(
                fast.try_next().unwrap().unwrap().container_id,
                i.to_string()
            );
        }
        assert_eq!(
            slow.try_next().unwrap().unwrap_err(),
            Ended::FellBehind { backlog: 3 }
        );
        assert_eq!(lock(&slow.sub.queue).events.len(), 0);
        assert_eq!(hub.subscribers(), 1);
    }

    #[test]
    fn a_subscriber_is_also_cut_off_by_the_bytes_it_has_not_read() {
        let hub = Arc::new(Hub::new(1000, 4).with_max_bytes(10_000));
        hub.restored();
        let slow = hub.subscribe().unwrap();
        let fast = hub.subscribe().unwrap();
        let big = "x".repeat(4000); // ~4.3 KB each as counted
        for _ in 0..3 {
            hub.publish(ev(&big));
            assert!(fast.try_next().unwrap().is_ok());
        }
        assert_eq!(
            slow.try_next().unwrap().unwrap_err(),
            Ended::FellBehindBytes { bytes: 10_000 }
        );
        assert_eq!(lock(&slow.sub.queue).bytes, 0);
        assert_eq!(lock(&fast.sub.queue).bytes, 0);
        assert_eq!(hub.subscribers(), 1);
    }

    #[test]
    fn restore_events_go_to_the_first_subscriber_only() {
        let hub = Arc::new(Hub::new(8, 4));
        assert!(hub.wanted(), "restore events are kept");
        hub.publish(ev("exited-while-down"));
        hub.restored();
        assert!(!hub.wanted());
        let first = hub.subscribe().unwrap();
        let second = hub.subscribe().unwrap();
        assert_eq!(
            first.try_next().unwrap().unwrap().container_id,
            "exited-while-down"
        );
        assert!(first.try_next().is_none());
        assert!(second.try_next().is_none());
    }

    #[test]
    fn subscribers_are_capped() {
        let hub = Arc::new(Hub::new(8, 2));
        let _a = hub.subscribe().unwrap();
        let _b = hub.subscribe().unwrap();
        assert!(hub.subscribe().is_none());
    }

    #[tokio::test]
    async fn next_waits_for_a_publication() {
        let hub = Arc::new(Hub::new(8, 2));
        hub.restored();
        let s = hub.subscribe().unwrap();
        let h = hub.clone();
        let t = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            h.publish(ev("late"));
            h.close();
        });
        assert_eq!(s.next().await.unwrap().container_id, "late");
        assert_eq!(s.next().await.unwrap_err(), Ended::Closed);
        t.await.unwrap();
    }
}
