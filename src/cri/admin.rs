//! sandboxd's admin API (`sandboxd.v1.Admin`): the self-audit behind `sandboxctl doctor`.

use tonic::{Request, Response, Status};

use super::CriService;
use crate::api::admin::{self, admin_server::Admin};

/// The longest grace a caller may ask for (a year): beyond it, nothing would ever be old enough.
const MAX_GRACE_SECONDS: i64 = 365 * 24 * 3600;

#[tonic::async_trait]
impl Admin for CriService {
    async fn audit(
        &self,
        req: Request<admin::AuditRequest>,
    ) -> Result<Response<admin::AuditResponse>, Status> {
        let req = req.into_inner();
        if !(0..=MAX_GRACE_SECONDS).contains(&req.grace_seconds) {
            return Err(Status::invalid_argument(format!(
                "Audit: grace_seconds must be 0…{MAX_GRACE_SECONDS}, not {}",
                req.grace_seconds
            )));
        }
        let grace = std::time::Duration::from_secs(req.grace_seconds as u64);
        let report = self
            .call("Audit", "", move |rt| {
                Ok(match req.fix {
                    true => rt.audit_fix(grace),
                    false => rt.audit(),
                })
            })
            .await?;
        Ok(Response::new(admin::AuditResponse {
            orphans: report
                .orphans
                .into_iter()
                .map(|o| admin::Orphan {
                    kind: o.kind.as_str().to_string(),
                    owner: o.owner,
                    path: o.path.display().to_string(),
                    age_seconds: o.age.map_or(-1, |a| a.as_secs() as i64),
                    fixed: matches!(o.fixed, Some(Ok(()))),
                    error: match o.fixed {
                        Some(Err(e)) => e,
                        _ => String::new(),
                    },
                })
                .collect(),
            took_micros: report.took.as_micros() as i64,
        }))
    }
}
