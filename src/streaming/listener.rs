//! What the streaming server does before a request is read: TLS, and caps on open
//! connections (in total, never over a quarter of the fd limit, and per client address) so
//! that half-open connections cannot starve the daemon. At a cap, the oldest connection that
//! has not sent a request yet makes room for the new one: a flood of half-open connections
//! only ever displaces itself, and a client that sends its request at once gets through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::StreamingConfig;
use crate::error::{Error, Result};
use crate::state::lock;

/// Caps on open connections, in total and per client address. A connection holds its
/// [`ConnSlot`] until it closes (its session included).
pub(super) struct ConnLimits {
    total: Arc<tokio::sync::Semaphore>,
    per_ip: Arc<Mutex<HashMap<std::net::IpAddr, usize>>>,
    max_per_ip: usize,
    /// Connections that have not sent a request yet, oldest first: what a cap evicts.
    waiting: Arc<Mutex<std::collections::BTreeMap<u64, Waiting>>>,
    next: std::sync::atomic::AtomicU64,
}

/// A connection with no request yet: its slot (taken away to evict it) and its task.
struct Waiting {
    ip: std::net::IpAddr,
    slot: Arc<Mutex<Option<ConnSlot>>>,
    task: Option<tokio::task::AbortHandle>,
}

/// A connection's place among the waiting ones, and its slot.
pub(super) struct Admitted {
    id: u64,
    slot: Arc<Mutex<Option<ConnSlot>>>,
    waiting: Arc<Mutex<std::collections::BTreeMap<u64, Waiting>>>,
}

impl Admitted {
    /// Its first request arrived: no longer evictable.
    pub(super) fn active(&self) {
        lock(&self.waiting).remove(&self.id);
    }

    /// Its task, aborted if it is evicted.
    pub(super) fn track(&self, task: tokio::task::AbortHandle) {
        if let Some(w) = lock(&self.waiting).get_mut(&self.id) {
            w.task = Some(task);
        }
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        lock(&self.waiting).remove(&self.id);
        lock(&self.slot).take();
    }
}

pub(super) struct ConnSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    ip: std::net::IpAddr,
    per_ip: Arc<Mutex<HashMap<std::net::IpAddr, usize>>>,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        let mut m = lock(&self.per_ip);
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

impl ConnLimits {
    pub(super) fn new(cfg: &StreamingConfig) -> ConnLimits {
        let fd_share = fd_limit() / 4;
        let total = cfg.max_connections.min(fd_share).max(1);
        if total < cfg.max_connections {
            tracing::warn!(
                max_connections = cfg.max_connections,
                using = total,
                "streaming connections capped to a quarter of the file descriptor limit"
            );
        }
        ConnLimits {
            total: Arc::new(tokio::sync::Semaphore::new(total)),
            per_ip: Arc::new(Mutex::new(HashMap::new())),
            max_per_ip: cfg.max_connections_per_ip.max(1),
            waiting: Arc::new(Mutex::new(std::collections::BTreeMap::new())),
            next: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A slot for a new connection from `ip`: free, or made by evicting the oldest
    /// connection still without a request (from `ip` when `ip` is at its own cap).
    pub(super) fn admit_evicting(&self, ip: std::net::IpAddr) -> Option<Admitted> {
        let slot = match self.admit(ip) {
            Some(s) => s,
            None => {
                let ip_full = lock(&self.per_ip).get(&ip).copied().unwrap_or(0) >= self.max_per_ip;
                let victim = {
                    let mut w = lock(&self.waiting);
                    let id = w
                        .iter()
                        .find(|(_, v)| !ip_full || v.ip == ip)
                        .map(|(id, _)| *id)?;
                    w.remove(&id)
                }?;
                // Its slot goes now (the permit with it); its task when next polled.
                lock(&victim.slot).take();
                if let Some(t) = victim.task {
                    t.abort();
                }
                tracing::debug!(evicted = %victim.ip, "streaming connection without a request evicted at the cap");
                self.admit(ip)?
            }
        };
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let slot = Arc::new(Mutex::new(Some(slot)));
        lock(&self.waiting).insert(
            id,
            Waiting {
                ip,
                slot: slot.clone(),
                task: None,
            },
        );
        Some(Admitted {
            id,
            slot,
            waiting: self.waiting.clone(),
        })
    }

    fn admit(&self, ip: std::net::IpAddr) -> Option<ConnSlot> {
        let permit = self.total.clone().try_acquire_owned().ok()?;
        let mut m = lock(&self.per_ip);
        let n = m.entry(ip).or_insert(0);
        if *n >= self.max_per_ip {
            return None;
        }
        *n += 1;
        Some(ConnSlot {
            _permit: permit,
            ip,
            per_ip: self.per_ip.clone(),
        })
    }
}

/// The soft limit on open file descriptors of this process.
pub fn fd_limit() -> usize {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft as usize)
        .unwrap_or(1024)
}

/// The TLS acceptor for the configured certificate and key, if any.
pub(super) fn tls_acceptor(cfg: &StreamingConfig) -> Result<Option<tokio_rustls::TlsAcceptor>> {
    use rustls_pki_types::pem::PemObject;
    let (cert, key) = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (None, None) => return Ok(None),
        (Some(c), Some(k)) => (c, k),
        _ => {
            return Err(Error::Config(
                "streaming: tls_cert_file and tls_key_file go together".into(),
            ))
        }
    };
    let bad =
        |what: &str, e: &dyn std::fmt::Display| Error::Config(format!("streaming TLS {what}: {e}"));
    let chain = rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(&cert.display().to_string(), &e))?
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| bad(&cert.display().to_string(), &e))?;
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(key)
        .map_err(|e| bad(&key.display().to_string(), &e))?;
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| bad("protocols", &e))?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(|e| bad("certificate", &e))?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))))
}
