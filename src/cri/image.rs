//! Image messages: images out, registry credentials in.

use crate::api::v1 as cri;

use crate::error::Error;
use crate::image::ImageRecord;

/// An image record as `ListImages` and `ImageStatus` show it.
pub fn image_to_cri(i: &ImageRecord) -> cri::Image {
    let user = i.config.user.split(':').next().unwrap_or("");
    let (uid, username) = match user.parse::<i64>() {
        Ok(n) => (Some(cri::Int64Value { value: n }), String::new()),
        Err(_) if user.is_empty() => (Some(cri::Int64Value { value: 0 }), String::new()),
        Err(_) => (None, user.to_string()),
    };
    cri::Image {
        id: i.id.clone(),
        repo_tags: i.repo_tags.clone(),
        repo_digests: i.repo_digests.clone(),
        size: i.size,
        uid,
        username,
        spec: Some(cri::ImageSpec {
            image: i.id.clone(),
            ..Default::default()
        }),
        pinned: false,
    }
}

/// CRI `AuthConfig` → pull credentials (`auth` is base64 of `user:password`).
pub fn auth(a: Option<&cri::AuthConfig>) -> Result<crate::image::Auth, Error> {
    let Some(a) = a else {
        return Ok(crate::image::Auth::default());
    };
    let (mut username, mut password) = (a.username.clone(), a.password.clone());
    if username.is_empty() && !a.auth.is_empty() {
        use base64::Engine;
        let raw = base64::engine::general_purpose::STANDARD
            .decode(a.auth.trim())
            .map_err(|e| Error::InvalidArgument(format!("auth.auth is not base64: {e}")))?;
        let text = String::from_utf8(raw)
            .map_err(|_| Error::InvalidArgument("auth.auth is not UTF-8".into()))?;
        let (u, p) = text
            .split_once(':')
            .ok_or_else(|| Error::InvalidArgument("auth.auth is not user:password".into()))?;
        (username, password) = (u.to_string(), p.to_string());
    }
    if !a.identity_token.is_empty() && username.is_empty() && a.registry_token.is_empty() {
        return Err(Error::InvalidArgument(
            "auth.identity_token (OAuth refresh tokens) is not supported; pass a registry_token or username/password".into(),
        ));
    }
    Ok(crate::image::Auth {
        username,
        password,
        registry_token: a.registry_token.clone(),
        server_address: a.server_address.clone(),
    })
}
