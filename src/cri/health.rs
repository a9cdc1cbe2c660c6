//! The runtime's health as CRI `Status` reports it: conditions (RuntimeReady, NetworkReady,
//! and RecordsReadable while records are quarantined), the handlers with their features.

use crate::api::v1 as cri;

/// `RuntimeHealth` → `StatusResponse` (`verbose`: the network list and the config as info).
pub fn status_to_cri(
    health: crate::health::RuntimeHealth,
    cfg: &crate::config::Config,
    verbose: bool,
) -> cri::StatusResponse {
    let crate::health::RuntimeHealth {
        network,
        handlers,
        not_offered,
        quarantined,
    } = health;
    let mut conditions = vec![cri::RuntimeCondition {
        r#type: "RuntimeReady".into(),
        status: true,
        reason: String::new(),
        message: String::new(),
    }];
    let mut info = std::collections::HashMap::new();
    match &network {
        Ok(list) => {
            conditions.push(cri::RuntimeCondition {
                r#type: "NetworkReady".into(),
                status: true,
                reason: String::new(),
                message: String::new(),
            });
            if verbose {
                info.insert(
                    "network".to_string(),
                    serde_json::to_string(list).unwrap_or_default(),
                );
            }
        }
        Err(e) => conditions.push(cri::RuntimeCondition {
            r#type: "NetworkReady".into(),
            status: false,
            reason: "NetworkPluginNotReady".into(),
            message: e.clone(),
        }),
    }
    // Records found unreadable at start-up: reported until RemovePodSandbox /
    // RemoveContainer of their ids finishes them (kubelet acts only on the two
    // conditions above; this one is for the operator).
    if !quarantined.is_empty() {
        conditions.push(cri::RuntimeCondition {
            r#type: "RecordsReadable".into(),
            status: false,
            reason: "RecordsQuarantined".into(),
            message: format!(
                "{} record(s) quarantined, nothing they own is collected; remove them by id: {}",
                quarantined.len(),
                quarantined.join("; ")
            ),
        });
    }
    if verbose {
        // The handlers left out of `runtime_handlers`, with the runtime's reason.
        let why: std::collections::BTreeMap<_, _> = not_offered.into_iter().collect();
        info.insert(
            "handlersNotOffered".to_string(),
            serde_json::to_string(&why).unwrap_or_default(),
        );
        info.insert(
            "config".to_string(),
            serde_json::to_string(&cfg).unwrap_or_default(),
        );
    }
    let userns_host_network = handlers.iter().any(|h| h.user_namespaces);
    cri::StatusResponse {
        status: Some(cri::RuntimeStatus { conditions }),
        info,
        runtime_handlers: handlers
            .into_iter()
            .map(|h| cri::RuntimeHandler {
                name: h.name,
                features: Some(cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: h.recursive_read_only_mounts,
                    user_namespaces: h.user_namespaces,
                }),
            })
            .collect(),
        features: Some(cri::RuntimeFeatures {
            supplemental_groups_policy: true,
            // Wherever pods can have user namespaces, they can have them on the node's
            // network too (tests/cri_v136.rs `user_namespaces_with_host_network`).
            user_namespaces_host_network: userns_host_network,
            // noexec, nodev and nosuid on any volume, for every handler.
            mount_options: true,
        }),
    }
}
