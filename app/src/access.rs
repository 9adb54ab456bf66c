//! Who may drive the daemon: the control API's token and the checks every
//! request passes before its body is read.
//!
//! The API can run turns that send email, so a request is answered only if
//! - its `Host` is the listen address (`localhost:{port}` too on loopback)
//!   and it carries no `Origin` but that address's — a web page in a local
//!   browser cannot reach it through DNS rebinding or a cross-site form
//!   (403);
//! - it carries `Authorization: Bearer {token}` (401);
//! - a POST, or any request with a body, says `Content-Type:
//!   application/json`, which a cross-site "simple" request cannot (403);
//! - its declared body is at most `api.max_body_bytes` (413, answered
//!   before a byte of the body is read; a chunked body is cut at the limit).
//!
//! The token is `api.token_env`'s variable when the config names one
//! (required to bind beyond loopback), else `{root}/api-token`, generated
//! at the first `serve` (32 random bytes, hex, mode 0600, written
//! atomically) and read by the CLI clients.
//!
//! Invariant: the token is never logged or printed ([`Token`]'s `Debug`
//! redacts it), and compared in constant time.

use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::api::Refused;
use crate::config::Config;

/// The token file under the root.
pub const TOKEN_FILE: &str = "api-token";

/// A token from the environment must be at least this long.
pub const MIN_TOKEN_CHARS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("api.token_env names {var}, which is not set (or empty); export it: the API token must come from the environment")]
    EnvUnset { var: String },
    #[error("{var} holds a token of {chars} characters; use at least {MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)")]
    EnvTooShort { var: String, chars: usize },
    #[error("{}: cannot read the API token: {source} (start `durable-agent serve` once to generate it, or set api.token_env)", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the API token file is empty or not one line of hex; delete it and restart `serve` to generate a new one", path.display())]
    Malformed { path: PathBuf },
    #[error("{}: cannot write the API token: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The API's bearer token.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// For `serve`: the environment's when the config names a variable,
    /// else `{root}/api-token`, generated if absent (the root exists: the
    /// daemon booted on it).
    pub fn for_serve(config: &Config) -> Result<Token, AccessError> {
        if let Some(token) = Self::from_env(config)? {
            return Ok(token);
        }
        let path = token_path(config);
        match std::fs::symlink_metadata(&path) {
            Ok(_) => Self::read(&path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Self::generate(&path),
            Err(source) => Err(AccessError::Read { path, source }),
        }
    }

    /// For the CLI clients: the environment's, else the root's file.
    pub fn for_client(config: &Config) -> Result<Token, AccessError> {
        match Self::from_env(config)? {
            Some(token) => Ok(token),
            None => Self::read(&token_path(config)),
        }
    }

    /// A token given as is (tests, the soak).
    pub fn new(value: impl Into<String>) -> Token {
        Token(value.into())
    }

    /// The header value a client sends.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.0)
    }

    /// Whether `presented` (an `Authorization` value) carries this token;
    /// constant time in the token's bytes.
    pub fn admits(&self, presented: &str) -> bool {
        let Some(given) = presented.strip_prefix("Bearer ") else {
            return false;
        };
        let (a, b) = (self.0.as_bytes(), given.trim().as_bytes());
        if a.len() != b.len() {
            return false;
        }
        a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    fn from_env(config: &Config) -> Result<Option<Token>, AccessError> {
        let Some(var) = &config.api.token_env else {
            return Ok(None);
        };
        let value = std::env::var(var).unwrap_or_default();
        let value = value.trim();
        if value.is_empty() {
            return Err(AccessError::EnvUnset { var: var.clone() });
        }
        if value.chars().count() < MIN_TOKEN_CHARS {
            return Err(AccessError::EnvTooShort {
                var: var.clone(),
                chars: value.chars().count(),
            });
        }
        Ok(Some(Token(value.to_string())))
    }

    fn read(path: &Path) -> Result<Token, AccessError> {
        let text = std::fs::read_to_string(path).map_err(|source| AccessError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let token = text.trim();
        if token.len() < MIN_TOKEN_CHARS || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(AccessError::Malformed {
                path: path.to_path_buf(),
            });
        }
        Ok(Token(token.to_string()))
    }

    /// 32 random bytes as hex into `path`, 0600, atomically (tmp, fsync,
    /// rename, fsync the directory): a crash leaves no half token.
    fn generate(path: &Path) -> Result<Token, AccessError> {
        let bytes: [u8; 32] = rand::random();
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let write_err = |source| AccessError::Write {
            path: path.to_path_buf(),
            source,
        };
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(write_err)?;
        // The mode is masked by the umask at creation; say it again.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(write_err)?;
        file.write_all(format!("{token}\n").as_bytes())
            .map_err(write_err)?;
        file.sync_all().map_err(write_err)?;
        std::fs::rename(&tmp, path).map_err(write_err)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(write_err)?;
        }
        Ok(Token(token))
    }
}

/// `{root}/api-token`.
pub fn token_path(config: &Config) -> PathBuf {
    config.runtime.root.join(TOKEN_FILE)
}

/// The checks of a request's head (see the module doc).
#[derive(Debug, Clone)]
pub struct Gate {
    token: Token,
    /// The bound address (port 0 resolved).
    listen: SocketAddr,
    max_body_bytes: u64,
}

impl Gate {
    pub fn new(token: Token, listen: SocketAddr, max_body_bytes: u64) -> Gate {
        Gate {
            token,
            listen,
            max_body_bytes,
        }
    }

    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes
    }

    /// Host values naming this API.
    fn is_own_host(&self, host: &str) -> bool {
        let host = host.trim();
        host.eq_ignore_ascii_case(&self.listen.to_string())
            || (self.listen.ip().is_loopback()
                && host.eq_ignore_ascii_case(&format!("localhost:{}", self.listen.port())))
    }

    /// Check a request's method and headers; `body_length` is its declared
    /// `Content-Length` (None: none, or chunked).
    pub fn check(
        &self,
        method: &str,
        headers: &[(String, String)],
        body_length: Option<usize>,
    ) -> Result<(), Refused> {
        let header = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let forbidden = |message: String| Refused { status: 403, message };
        match header("Host") {
            Some(host) if self.is_own_host(host) => {}
            Some(host) => {
                return Err(forbidden(format!(
                    "Host {host:?} is not this API ({})",
                    self.listen
                )))
            }
            None => return Err(forbidden("a Host header is required".into())),
        }
        if let Some(origin) = header("Origin") {
            let own = origin
                .strip_prefix("http://")
                .is_some_and(|host| self.is_own_host(host.trim_end_matches('/')));
            if !own {
                return Err(forbidden(format!("cross-origin request from {origin:?} refused")));
            }
        }
        if !header("Authorization").is_some_and(|v| self.token.admits(v)) {
            return Err(Refused {
                status: 401,
                message: "missing or wrong API token: send `Authorization: Bearer <token>` (the token is in {root}/api-token, or the variable api.token_env names)".into(),
            });
        }
        let has_body = body_length.is_some_and(|n| n > 0) || header("Transfer-Encoding").is_some();
        if method == "POST" || has_body {
            let json = header("Content-Type").is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
            });
            if !json {
                return Err(forbidden(
                    "requests with a body must be Content-Type: application/json".into(),
                ));
            }
        }
        if let Some(n) = body_length {
            if n as u64 > self.max_body_bytes {
                return Err(too_large(self.max_body_bytes));
            }
        }
        Ok(())
    }
}

/// The 413 answer.
pub fn too_large(limit: u64) -> Refused {
    Refused {
        status: 413,
        message: format!("request body exceeds api.max_body_bytes = {limit}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> Gate {
        Gate::new(
            Token::new("0123456789abcdef0123"),
            "127.0.0.1:7341".parse().unwrap(),
            100,
        )
    }

    fn headers(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    const AUTH: (&str, &str) = ("Authorization", "Bearer 0123456789abcdef0123");

    #[test]
    fn each_check_answers_its_status() {
        let g = gate();
        let ok = headers(&[
            ("Host", "127.0.0.1:7341"),
            AUTH,
            ("Content-Type", "application/json"),
        ]);
        assert_eq!(g.check("POST", &ok, Some(10)), Ok(()));
        let local = headers(&[("Host", "localhost:7341"), AUTH]);
        assert_eq!(g.check("GET", &local, None), Ok(()));
        let status = |h: &[(&str, &str)], method: &str, len: Option<usize>| {
            g.check(method, &headers(h), len).err().map(|r| r.status)
        };
        assert_eq!(status(&[("Host", "127.0.0.1:7341")], "GET", None), Some(401));
        assert_eq!(
            status(
                &[("Host", "127.0.0.1:7341"), ("Authorization", "Bearer nope")],
                "GET",
                None
            ),
            Some(401)
        );
        assert_eq!(
            status(&[("Host", "evil.example:7341"), AUTH], "GET", None),
            Some(403)
        );
        assert_eq!(status(&[AUTH], "GET", None), Some(403));
        assert_eq!(
            status(
                &[
                    ("Host", "127.0.0.1:7341"),
                    ("Origin", "http://evil.example"),
                    AUTH
                ],
                "GET",
                None
            ),
            Some(403)
        );
        assert_eq!(
            status(
                &[
                    ("Host", "127.0.0.1:7341"),
                    ("Origin", "http://127.0.0.1:7341"),
                    AUTH
                ],
                "GET",
                None
            ),
            None
        );
        assert_eq!(
            status(
                &[("Host", "127.0.0.1:7341"), AUTH, ("Content-Type", "text/plain")],
                "POST",
                Some(5)
            ),
            Some(403)
        );
        assert_eq!(
            status(
                &[
                    ("Host", "127.0.0.1:7341"),
                    AUTH,
                    ("Content-Type", "application/json")
                ],
                "POST",
                Some(101)
            ),
            Some(413)
        );
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        assert_eq!(
            format!("{:?}", Token::new("secret-secret-secret")),
            "Token(<redacted>)"
        );
    }
}
