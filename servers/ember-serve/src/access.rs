//! Who may call what on `ember serve`, closed by default and open by choice (as vLLM's
//! `--api-key` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING`, SGLang's `--api-key` and admin key):
//! an API key checked on every route but `/health` (OpenAI's `Authorization: Bearer`), the
//! admin routes (adapter load/unload, weight updates) refused unless enabled, with their own
//! key when one is given, and the paths they load confined to directories the operator allows.

use super::api::ApiError;
use anyhow::{Context, Result, bail};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The routes that load files or change the weights.
pub const ADMIN_ROUTES: [&str; 3] = [
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/update_weights_from_disk",
];

/// The server's access rules.
#[derive(Debug, Clone, Default)]
pub struct Access {
    api_key: Option<String>,
    /// `None`: the admin routes are off.
    admin: Option<Admin>,
}

#[derive(Debug, Clone)]
struct Admin {
    /// The admin routes' key (else the API key, if any).
    key: Option<String>,
    /// Canonical directories admin loads may read below.
    allowed: Vec<PathBuf>,
}

/// What the command line says about access (keys already resolved from the environment).
pub struct AccessArgs<'a> {
    pub api_key: Option<String>,
    pub enable_admin: bool,
    pub admin_key: Option<String>,
    pub allowed_paths: &'a [PathBuf],
}

impl Access {
    /// The rules of `args`; every allowed directory must exist (it is canonicalised now, its
    /// symlinks resolved), and the admin settings need `--enable-admin`.
    pub fn new(args: AccessArgs) -> Result<Self> {
        for (name, key) in [
            ("--api-key", &args.api_key),
            ("--admin-key", &args.admin_key),
        ] {
            if key.as_ref().is_some_and(|k| k.trim().is_empty()) {
                bail!("{name} is empty");
            }
        }
        if !args.enable_admin && (args.admin_key.is_some() || !args.allowed_paths.is_empty()) {
            bail!("--admin-key and --allowed-path apply to the admin routes: add --enable-admin");
        }
        let admin = if args.enable_admin {
            let mut allowed = Vec::new();
            for dir in args.allowed_paths {
                let c = std::fs::canonicalize(dir)
                    .with_context(|| format!("--allowed-path {}", dir.display()))?;
                if !c.is_dir() {
                    bail!("--allowed-path {} is not a directory", dir.display());
                }
                allowed.push(c);
            }
            Some(Admin {
                key: args.admin_key,
                allowed,
            })
        } else {
            None
        };
        Ok(Self {
            api_key: args.api_key,
            admin,
        })
    }

    /// A warning for a server reachable beyond loopback without a key, if it is one.
    pub fn open_warning(&self, host: &str) -> Option<String> {
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        (!loopback && self.api_key.is_none()).then(|| {
            format!(
                "listening on {host} without an API key: anyone who reaches the port may use \
                 it (give --api-key, --api-key-env or EMBER_API_KEY)"
            )
        })
    }

    /// Whether a request for `path` with `headers` may go on: 403 for an admin route that is
    /// off, 401 for a missing or wrong key.
    pub fn check(&self, path: &str, headers: &HeaderMap) -> Result<(), ApiError> {
        if path == "/health" {
            return Ok(());
        }
        let key = if ADMIN_ROUTES.contains(&path) {
            let Some(admin) = &self.admin else {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "permission_error",
                    format!("{path} is disabled: start the server with --enable-admin"),
                ));
            };
            admin.key.as_ref().or(self.api_key.as_ref())
        } else {
            self.api_key.as_ref()
        };
        let Some(key) = key else {
            return Ok(());
        };
        match bearer(headers).or_else(|| x_api_key(headers)) {
            Some(given) if same(given.as_bytes(), key.as_bytes()) => Ok(()),
            Some(_) => Err(unauthorized("incorrect API key provided")),
            None => Err(unauthorized(
                "no API key provided: send `Authorization: Bearer <key>` (or `X-API-Key: <key>`)",
            )),
        }
    }

    /// `path` (from an admin request) canonicalised, if it lies below an allowed directory.
    pub fn allowed_path(&self, param: &str, path: &str) -> Result<PathBuf, ApiError> {
        let forbidden = |m: String| ApiError::new(StatusCode::FORBIDDEN, "permission_error", m);
        let allowed = self.admin.as_ref().map_or(&[][..], |a| &a.allowed[..]);
        if allowed.is_empty() {
            return Err(forbidden(format!(
                "{param}: no directory is allowed: start the server with --allowed-path DIR"
            )));
        }
        let c = std::fs::canonicalize(Path::new(path))
            .map_err(|e| ApiError::bad(param, format!("{param} `{path}`: {e}")))?;
        if allowed.iter().any(|dir| c.starts_with(dir)) {
            Ok(c)
        } else {
            Err(forbidden(format!(
                "{param} `{path}` is outside the allowed directories (--allowed-path)"
            )))
        }
    }
}

/// The key and the admin switch, checked before a request's body is read (every server's
/// outermost layer, `HttpLimits::guard`).
pub async fn authorize(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    match access.check(req.uri().path(), req.headers()) {
        Ok(()) => next.run(req).await,
        Err(e) => e.into_response(),
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
}

/// The key of an `X-API-Key` header (the Tinker SDK's).
fn x_api_key(headers: &HeaderMap) -> Option<&str> {
    headers.get("x-api-key")?.to_str().ok().map(str::trim)
}

/// The token of an `Authorization: Bearer <token>` header.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Equality whose time does not depend on where the inputs differ (only on their lengths).
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = a.len() ^ b.len();
    for i in 0..n {
        diff |= usize::from(a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, HeaderValue::from_str(a).unwrap());
        }
        h
    }

    fn access(api: Option<&str>, admin: bool, admin_key: Option<&str>) -> Access {
        Access::new(AccessArgs {
            api_key: api.map(str::to_string),
            enable_admin: admin,
            admin_key: admin_key.map(str::to_string),
            allowed_paths: &[],
        })
        .unwrap()
    }

    #[test]
    fn keys_and_admin_routes() {
        let status = |a: &Access, path: &str, auth: Option<&str>| {
            a.check(path, &headers(auth))
                .err()
                .map(|e| e.status.as_u16())
        };
        // Open by default for inference, closed for admin.
        let open = access(None, false, None);
        assert_eq!(status(&open, "/v1/completions", None), None);
        assert_eq!(status(&open, "/update_weights_from_disk", None), Some(403));
        // An API key guards every route but /health.
        let keyed = access(Some("s3cret"), true, None);
        assert_eq!(status(&keyed, "/health", None), None);
        assert_eq!(status(&keyed, "/v1/models", None), Some(401));
        assert_eq!(status(&keyed, "/v1/models", Some("Bearer nope")), Some(401));
        assert_eq!(status(&keyed, "/v1/models", Some("Bearer s3cret")), None);
        assert_eq!(status(&keyed, "/v1/models", Some("bearer  s3cret ")), None);
        assert_eq!(
            status(&keyed, "/v1/models", Some("Basic s3cret")),
            Some(401)
        );
        assert_eq!(
            status(&keyed, "/v1/load_lora_adapter", Some("Bearer s3cret")),
            None
        );
        // An admin key replaces the API key on the admin routes only.
        let both = access(Some("user"), true, Some("root"));
        assert_eq!(
            status(&both, "/v1/load_lora_adapter", Some("Bearer user")),
            Some(401)
        );
        assert_eq!(
            status(&both, "/v1/load_lora_adapter", Some("Bearer root")),
            None
        );
        assert_eq!(
            status(&both, "/v1/completions", Some("Bearer root")),
            Some(401)
        );
        assert!(same(b"abc", b"abc") && !same(b"abc", b"abd") && !same(b"abc", b"abcd"));
    }

    #[test]
    fn admin_settings_are_checked() {
        let err = |args: AccessArgs| Access::new(args).unwrap_err().to_string();
        let none: [PathBuf; 0] = [];
        let e = err(AccessArgs {
            api_key: None,
            enable_admin: false,
            admin_key: Some("k".into()),
            allowed_paths: &none,
        });
        assert!(e.contains("--enable-admin"), "{e}");
        let e = err(AccessArgs {
            api_key: Some(" ".into()),
            enable_admin: false,
            admin_key: None,
            allowed_paths: &none,
        });
        assert!(e.contains("--api-key is empty"), "{e}");
        let missing = [PathBuf::from("/no/such/ember/dir")];
        let e = err(AccessArgs {
            api_key: None,
            enable_admin: true,
            admin_key: None,
            allowed_paths: &missing,
        });
        assert!(e.contains("--allowed-path /no/such/ember/dir"), "{e}");
        assert!(access(None, false, None).open_warning("0.0.0.0").is_some());
        assert!(
            access(None, false, None)
                .open_warning("127.0.0.1")
                .is_none()
        );
        assert!(
            access(Some("k"), false, None)
                .open_warning("0.0.0.0")
                .is_none()
        );
    }

    #[test]
    fn loads_stay_below_the_allowed_directories() {
        let root = std::env::temp_dir().join(format!("ember-access-{}", std::process::id()));
        let (inside, outside) = (root.join("runs/a"), root.join("elsewhere"));
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let link = root.join("runs/escape");
        let _ = std::fs::remove_file(&link);
        #[cfg(unix)]
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let a = Access::new(AccessArgs {
            api_key: None,
            enable_admin: true,
            admin_key: None,
            allowed_paths: &[root.join("runs")],
        })
        .unwrap();
        let code = |p: &Path| {
            a.allowed_path("lora_path", &p.display().to_string())
                .err()
                .map(|e| e.status.as_u16())
        };
        assert_eq!(code(&inside), None);
        assert_eq!(code(&root.join("runs/a/../../elsewhere")), Some(403));
        assert_eq!(code(&outside), Some(403));
        #[cfg(unix)]
        assert_eq!(code(&link), Some(403), "a symlink out of the directory");
        assert_eq!(code(&root.join("runs/none")), Some(400));
        // Admin on, but no directory allowed: every load is refused.
        let none = access(None, true, None);
        let e = none.allowed_path("model_path", &inside.display().to_string());
        assert_eq!(e.err().map(|e| e.status.as_u16()), Some(403));
        std::fs::remove_dir_all(&root).ok();
    }
}
