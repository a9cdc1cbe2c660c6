//! The hooks the verbs call, one per lifecycle event: each hands the pod (and container) to
//! the subscribed plugins in order; the blocking ones (RunPodSandbox, CreateContainer,
//! UpdateContainer and the pod's update) fail the verb on a plugin's error and hide the id
//! while they run.

use sandboxd_nri_api::api;
use sandboxd_nri_api::api::Event;

use super::plugin::Failure;
use super::{adjust, convert, ordered, prune, Nri, Shared};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::model::container::ContainerRecord;
use crate::model::sandbox::SandboxRecord;

impl Nri {
    /// RunPodSandbox: the pod is hidden while the plugins see it; an error of one fails the
    /// creation (the caller tears it down).
    pub(crate) fn run_pod_sandbox(&self, r: &SandboxRecord, cfg: &Config) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let _hidden = Hidden::new(&self.shared, &r.id);
        self.event(Event::RunPodSandbox, r, None, cfg, true)
            .map_err(|m| Error::FailedPrecondition(format!("sandbox {}: {m}", r.id)))
    }

    pub(crate) fn stop_pod_sandbox(&self, r: &SandboxRecord, cfg: &Config) {
        let _ = self.event(Event::StopPodSandbox, r, None, cfg, false);
    }

    pub(crate) fn remove_pod_sandbox(&self, r: &SandboxRecord, cfg: &Config) {
        let _ = self.event(Event::RemovePodSandbox, r, None, cfg, false);
    }

    /// CreateContainer: each subscribed plugin in turn sees the container as the spec
    /// stands and may adjust it; the adjustments are applied to `spec` (CDI devices through
    /// `inject`), and what plugins ask of other containers is applied after. The container
    /// is hidden meanwhile. Conflicts and plugins' errors fail the creation.
    pub(crate) fn create_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
        spec: &mut oci_spec::runtime::Spec,
        inject: &dyn Fn(&[String], &mut oci_spec::runtime::Spec) -> Result<()>,
    ) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let _hidden = Hidden::new(&self.shared, &c.id);
        let fail = |m: String| Error::FailedPrecondition(format!("container {}: {m}", c.id));
        let pod = convert::pod(sb, cfg);
        let shared = self.shared.clone();
        // The read side is held across all plugins' calls: no plugin joins halfway.
        let guard = self
            .block_on(async move { shared.sync.clone().read_owned().await })
            .ok_or_else(|| fail("NRI is shutting down".into()))?;
        let mut owners = adjust::Owners::default();
        let mut updates = Vec::new();
        let mut evictions = Vec::new();
        // What validators see: the container as it came, every adjustment merged, and who
        // was asked.
        let original = convert::creating(
            c,
            &serde_json::to_value(&*spec).map_err(|e| fail(e.to_string()))?,
        );
        let mut merged = api::ContainerAdjustment::default();
        let mut consulted = Vec::new();
        for p in ordered(&self.shared) {
            if !p.subscribed(Event::CreateContainer) {
                continue;
            }
            let mut json = serde_json::to_value(&*spec).map_err(|e| fail(e.to_string()))?;
            let req = api::CreateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(convert::creating(c, &json)),
            };
            let asked = self.ask(&p, "CreateContainer", move |cl, ctx| async move {
                cl.create_container(ctx, &req).await
            });
            let Some(reply) = asked.map_err(fail)? else {
                continue;
            };
            if reply.update.iter().any(|u| u.container_id == c.id) {
                return Err(fail(format!(
                    "NRI plugin {} asked to update the container it is creating",
                    p.id
                )));
            }
            updates.extend(reply.update);
            evictions.extend(reply.evict);
            consulted.push(api::PluginInstance {
                name: p.name.clone(),
                index: p.idx.clone(),
            });
            if let Some(a) = &reply.adjust {
                adjust::merge_into(&mut merged, a);
                let cdi = adjust::apply(&mut json, a, &p.id, &mut owners)
                    .map_err(|m| fail(format!("adjustment by NRI plugin {}: {m}", p.id)))?;
                *spec = serde_json::from_value(json)
                    .map_err(|e| fail(format!("adjustment by NRI plugin {}: {e}", p.id)))?;
                inject(&cdi, spec)?;
            }
        }
        // Validators (policy plugins) may refuse the result as a whole.
        for p in ordered(&self.shared) {
            if !p.subscribed(Event::ValidateContainerAdjustment) {
                continue;
            }
            let req = api::ValidateContainerAdjustmentRequest {
                pod: Some(pod.clone()),
                container: Some(original.clone()),
                adjust: Some(merged.clone()),
                update: updates.clone(),
                owners: None,
                plugins: consulted.clone(),
            };
            let asked = self.ask(
                &p,
                "ValidateContainerAdjustment",
                move |cl, ctx| async move { cl.validate_container_adjustment(ctx, &req).await },
            );
            if let Some(r) = asked.map_err(fail)? {
                if r.reject {
                    return Err(fail(format!(
                        "NRI validator {} rejected the plugins' adjustments: {}",
                        p.id, r.reason
                    )));
                }
            }
        }
        drop(guard);
        prune(&self.shared);
        self.apply_updates("CreateContainer", &updates, &evictions);
        Ok(())
    }

    fn apply_updates(
        &self,
        what: &str,
        updates: &[api::ContainerUpdate],
        evict: &[api::ContainerEviction],
    ) {
        if updates.is_empty() && evict.is_empty() {
            return;
        }
        if let Some(u) = self.shared.updates.get() {
            let failed = u.apply(what, updates, evict, &|| false);
            if let Some(f) = failed.first() {
                tracing::warn!(first = %f.container_id, failed = failed.len(), from = what, "NRI plugins' container updates failed");
            }
        }
    }

    pub(crate) fn post_create_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) {
        let _ = self.event(Event::PostCreateContainer, sb, Some(c), cfg, false);
    }

    /// StartContainer: a plugin's error fails the start.
    pub(crate) fn start_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) -> Result<()> {
        self.event(Event::StartContainer, sb, Some(c), cfg, true)
            .map_err(|m| Error::FailedPrecondition(format!("container {}: {m}", c.id)))
    }

    pub(crate) fn post_start_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) {
        let _ = self.event(Event::PostStartContainer, sb, Some(c), cfg, false);
    }

    /// UpdateContainer: plugins may change the resources asked for (the last plugin's word
    /// for this container wins) and update others. Returns the resources to apply.
    pub(crate) fn update_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
        resources: &crate::model::resources::Resources,
    ) -> Result<crate::model::resources::Resources> {
        if !self.active() {
            return Ok(resources.clone());
        }
        let fail = |m: String| Error::FailedPrecondition(format!("container {}: {m}", c.id));
        let pod = convert::pod(sb, cfg);
        let ctr = convert::created(c);
        let mut want = resources.clone();
        let shared = self.shared.clone();
        let (mut updates, mut evictions) = (Vec::new(), Vec::new());
        let guard = self
            .block_on(async move { shared.sync.clone().read_owned().await })
            .ok_or_else(|| fail("NRI is shutting down".into()))?;
        for p in ordered(&self.shared) {
            if !p.subscribed(Event::UpdateContainer) {
                continue;
            }
            let req = api::UpdateContainerRequest {
                pod: Some(pod.clone()),
                container: Some(ctr.clone()),
                linux_resources: Some(convert::resources(&want)),
            };
            let asked = self.ask(&p, "UpdateContainer", move |cl, ctx| async move {
                cl.update_container(ctx, &req).await
            });
            let Some(reply) = asked.map_err(fail)? else {
                continue;
            };
            for u in reply.update {
                if u.container_id == c.id {
                    if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
                        want = convert::update_resources(&want, r)
                            .map_err(|m| fail(format!("update by NRI plugin {}: {m}", p.id)))?;
                    }
                } else {
                    updates.push(u);
                }
            }
            evictions.extend(reply.evict);
        }
        drop(guard);
        prune(&self.shared);
        self.apply_updates("UpdateContainer", &updates, &evictions);
        Ok(want)
    }

    pub(crate) fn post_update_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        cfg: &Config,
    ) {
        let _ = self.event(Event::PostUpdateContainer, sb, Some(c), cfg, false);
    }

    /// StopContainer: sent once per container, whether it was stopped or exited by itself;
    /// plugins may update other containers (their freed resources).
    pub(crate) fn stop_container(&self, sb: &SandboxRecord, c: &ContainerRecord, cfg: &Config) {
        if !self.active() || crate::state::lock(&self.shared.stopped).contains(&c.id) {
            return;
        }
        self.stop_container_as(sb, convert::created(c), cfg);
    }

    /// StopContainer with the container as plugins see it (`ctr`).
    fn stop_container_as(&self, sb: &SandboxRecord, ctr: api::Container, cfg: &Config) {
        if !self.active() || !crate::state::lock(&self.shared.stopped).insert(ctr.id.clone()) {
            return;
        }
        let pod = convert::pod(sb, cfg);
        let shared = self.shared.clone();
        let updates = self
            .block_on(async move {
                let _g = shared.sync.read().await;
                let mut updates = Vec::new();
                for p in ordered(&shared) {
                    if !p.subscribed(Event::StopContainer) {
                        continue;
                    }
                    let req = api::StopContainerRequest {
                        pod: Some(pod.clone()),
                        container: Some(ctr.clone()),
                    };
                    match p
                        .request("StopContainer", |cl, ctx| async move {
                            cl.stop_container(ctx, &req).await
                        })
                        .await
                    {
                        Ok(r) => updates.extend(r.update),
                        Err(Failure::Refused(m)) => {
                            tracing::warn!(plugin = %p.id, error = %m, "NRI plugin failed StopContainer")
                        }
                        Err(Failure::Dropped(_) | Failure::Unimplemented) => {}
                    }
                }
                updates
            })
            .unwrap_or_default();
        prune(&self.shared);
        self.apply_updates("StopContainer", &updates, &[]);
    }

    /// The container as plugins see it (its spec as their adjustments left it), taken before
    /// RemoveContainer removes its bundle: the events that follow still show what they set.
    pub(crate) fn seen(&self, c: &ContainerRecord) -> Option<api::Container> {
        self.active().then(|| convert::created(c))
    }

    /// RemoveContainer (StopContainer first if it never went out), with the container as
    /// [`seen`](Self::seen) before its bundle went.
    pub(crate) fn remove_container(
        &self,
        sb: &SandboxRecord,
        c: &ContainerRecord,
        seen: Option<api::Container>,
        cfg: &Config,
    ) {
        if !self.active() {
            return;
        }
        let ctr = seen.unwrap_or_else(|| convert::created(c));
        self.stop_container_as(sb, ctr.clone(), cfg);
        let _ = self.notify(
            Event::RemoveContainer,
            convert::pod(sb, cfg),
            Some(ctr),
            false,
        );
        crate::state::lock(&self.shared.stopped).remove(&c.id);
    }

    /// UpdatePodSandbox (pod resize): told, then PostUpdatePodSandbox.
    pub(crate) fn update_pod_sandbox(&self, sb: &SandboxRecord, cfg: &Config) -> Result<()> {
        if !self.active() {
            return Ok(());
        }
        let pod = convert::pod(sb, cfg);
        let shared = self.shared.clone();
        let pod2 = pod.clone();
        let r = self
            .block_on(async move {
                let _g = shared.sync.read().await;
                for p in ordered(&shared) {
                    if !p.subscribed(Event::UpdatePodSandbox) {
                        continue;
                    }
                    let req = api::UpdatePodSandboxRequest {
                        pod: Some(pod2.clone()),
                        overhead_linux_resources: pod2
                            .linux
                            .as_ref()
                            .and_then(|l| l.pod_overhead.clone()),
                        linux_resources: pod2.linux.as_ref().and_then(|l| l.pod_resources.clone()),
                    };
                    if let Err(Failure::Refused(m)) = p
                        .request("UpdatePodSandbox", |cl, ctx| async move {
                            cl.update_pod_sandbox(ctx, &req).await
                        })
                        .await
                    {
                        return Err(m);
                    }
                }
                Ok(())
            })
            .unwrap_or(Ok(()));
        prune(&self.shared);
        r.map_err(|m| Error::FailedPrecondition(format!("sandbox {}: {m}", sb.id)))?;
        let _ = self.notify(Event::PostUpdatePodSandbox, pod, None, false);
        Ok(())
    }
}

/// An id left out of List and Status while it lives.
struct Hidden<'a> {
    shared: &'a Shared,
    id: String,
}

impl<'a> Hidden<'a> {
    fn new(shared: &'a Shared, id: &str) -> Self {
        crate::state::lock(&shared.hidden).insert(id.to_string());
        Hidden {
            shared,
            id: id.to_string(),
        }
    }
}

impl Drop for Hidden<'_> {
    fn drop(&mut self) {
        crate::state::lock(&self.shared.hidden).remove(&self.id);
    }
}
