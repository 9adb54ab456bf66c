//! Who may drive the daemon: the control API's token and the checks every
//! request passes before its body is read.
//!
//! The API can run turns that send email, so a request is answered only if
//! - its `Host` names this API on the listen port: the listen address,
//!   `localhost` on a loopback or wildcard listener, any IP address on a
//!   wildcard one (`0.0.0.0`, `::`: a client names the address it
//!   reached), or a name in `api.allowed_hosts`; and it carries no
//!   `Origin` but such a host's — a web page in a local browser cannot
//!   reach it through DNS rebinding (whose `Host` is the attacker's DNS
//!   name, never an IP address) or a cross-site form (403);
//! - it carries `Authorization: Bearer {token}` (401);
//! - a POST, or any request with a body, says `Content-Type:
//!   application/json`, which a cross-site "simple" request cannot (403);
//! - its declared body is at most `api.max_body_bytes` (413, answered
//!   before a byte of the body is read; a chunked body is cut at the limit);
//! - if it names the root it is meant for ([`ROOT_HEADER`]: the store id
//!   `root.json` holds, which the CLI sends), that is this daemon's root
//!   (409): two configs that share `api.listen` cannot have one root's
//!   command applied to the other's.
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

/// The request header naming the root a request is meant for: its store
/// id (`root.json`'s `store_id`, decimal).
pub const ROOT_HEADER: &str = "X-Durable-Agent-Root";

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
        // The scheme is case-insensitive (RFC 9110 §11.1).
        let Some((scheme, given)) = presented.trim_start().split_once(' ') else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("Bearer") {
            return false;
        }
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
    /// DNS names a client may use for this API (`api.allowed_hosts`).
    allowed_hosts: Vec<String>,
    /// The store id of the root this daemon serves, when known.
    root: Option<u32>,
}

impl Gate {
    pub fn new(token: Token, listen: SocketAddr, max_body_bytes: u64) -> Gate {
        Gate {
            token,
            listen,
            max_body_bytes,
            allowed_hosts: Vec::new(),
            root: None,
        }
    }

    /// Refuse requests that name another root than `store_id`'s (409).
    pub fn serving_root(mut self, store_id: u32) -> Gate {
        self.root = Some(store_id);
        self
    }

    /// Also admit these DNS names in `Host` (`api.allowed_hosts`).
    pub fn with_allowed_hosts(mut self, names: &[String]) -> Gate {
        self.allowed_hosts = names.to_vec();
        self
    }

    pub fn max_body_bytes(&self) -> u64 {
        self.max_body_bytes
    }

    /// Host values naming this API (see the module doc): the port must be
    /// the listen port (absent only when that is 80), the name the listen
    /// address, `localhost` where loopback reaches the listener, any IP
    /// address on a wildcard listener, or an allowed name.
    fn is_own_host(&self, host: &str) -> bool {
        let Some((name, port)) = split_host(host.trim()) else {
            return false;
        };
        if port.unwrap_or(80) != self.listen.port() {
            return false;
        }
        let ip = self.listen.ip();
        match name.parse::<std::net::IpAddr>() {
            Ok(named) => named == ip || ip.is_unspecified(),
            Err(_) => {
                ((ip.is_loopback() || ip.is_unspecified()) && name.eq_ignore_ascii_case("localhost"))
                    || self.allowed_hosts.iter().any(|a| a.eq_ignore_ascii_case(name))
            }
        }
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
        if let (Some(own), Some(asked)) = (self.root, header(ROOT_HEADER)) {
            if asked.trim() != own.to_string() {
                return Err(Refused {
                    status: 409,
                    message: format!(
                        "this daemon serves another root (store {own}; the request is for store {}): two configs share api.listen {}; give each root its own",
                        asked.trim(),
                        self.listen
                    ),
                });
            }
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

/// A `Host` value's name and port: `name`, `name:port`, `[v6]` or
/// `[v6]:port` (the brackets dropped); `None` if it is none of these.
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = match host.strip_prefix('[') {
        Some(rest) => {
            let (name, after) = rest.split_once(']')?;
            match after {
                "" => (name, None),
                _ => (name, Some(after.strip_prefix(':')?)),
            }
        }
        None => match host.split_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        },
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    (!name.is_empty()).then_some((name, port))
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

    /// A wildcard listener is reached at some address of the machine, and
    /// a client names that address (found by a review: only the literal
    /// `0.0.0.0:7341` was admitted, so every real client got 403).
    #[test]
    fn a_wildcard_listener_admits_the_addresses_it_answers_on_and_no_dns_name_unlisted() {
        for listen in ["0.0.0.0:7341", "[::]:7341"] {
            let g = Gate::new(Token::new("0123456789abcdef0123"), listen.parse().unwrap(), 100)
                .with_allowed_hosts(&["agent.lan".to_string()]);
            let status = |host: &str, origin: Option<&str>| {
                let mut h = vec![("Host", host), AUTH];
                if let Some(o) = origin {
                    h.push(("Origin", o));
                }
                g.check("GET", &headers(&h), None).err().map(|r| r.status)
            };
            for host in [
                "127.0.0.1:7341",
                "192.168.1.20:7341",
                "[::1]:7341",
                "[fe80::1]:7341",
                "localhost:7341",
                "LOCALHOST:7341",
                "agent.lan:7341",
                "Agent.LAN:7341",
                listen,
            ] {
                assert_eq!(status(host, None), None, "{listen}: Host {host}");
            }
            // DNS rebinding names the attacker's host; a wrong port, a
            // missing one (80 implied), a malformed value: all refused.
            for host in [
                "evil.example:7341",
                "127.0.0.1:7342",
                "127.0.0.1",
                "agent.lan",
                "[::1]7341",
                "127.0.0.1:x",
                ":7341",
                "",
            ] {
                assert_eq!(status(host, None), Some(403), "{listen}: Host {host:?}");
            }
            assert_eq!(status("127.0.0.1:7341", Some("http://agent.lan:7341")), None);
            assert_eq!(
                status("127.0.0.1:7341", Some("http://evil.example:7341")),
                Some(403)
            );
        }
        // A specific address admits itself and allowed names, not others.
        let g = Gate::new(
            Token::new("0123456789abcdef0123"),
            "192.168.1.20:7341".parse().unwrap(),
            100,
        );
        let host = |h: &str| {
            g.check("GET", &headers(&[("Host", h), AUTH]), None)
                .err()
                .map(|r| r.status)
        };
        assert_eq!(host("192.168.1.20:7341"), None);
        assert_eq!(host("127.0.0.1:7341"), Some(403));
        assert_eq!(host("localhost:7341"), Some(403));
        // A loopback listener on port 80 is named without a port too.
        let g = Gate::new(
            Token::new("0123456789abcdef0123"),
            "127.0.0.1:80".parse().unwrap(),
            100,
        );
        let host = |h: &str| {
            g.check("GET", &headers(&[("Host", h), AUTH]), None)
                .err()
                .map(|r| r.status)
        };
        assert_eq!(host("localhost"), None);
        assert_eq!(host("127.0.0.1"), None);
        assert_eq!(host("127.0.0.1:80"), None);
    }

    #[test]
    fn a_request_for_another_root_is_refused() {
        let g = gate().serving_root(7);
        let with_root = |id: &str| headers(&[("Host", "127.0.0.1:7341"), AUTH, (ROOT_HEADER, id)]);
        assert_eq!(g.check("GET", &with_root("7"), None), Ok(()));
        let refused = g.check("GET", &with_root("8"), None).err();
        assert_eq!(refused.as_ref().map(|r| r.status), Some(409), "{refused:?}");
        // No header (curl): no claim to check.
        assert_eq!(
            g.check("GET", &headers(&[("Host", "127.0.0.1:7341"), AUTH]), None),
            Ok(())
        );
        // A stranger learns nothing: the token is checked first.
        let stranger = headers(&[("Host", "127.0.0.1:7341"), (ROOT_HEADER, "8")]);
        assert_eq!(g.check("GET", &stranger, None).err().map(|r| r.status), Some(401));
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_is_not() {
        let g = gate();
        for (value, admitted) in [
            ("Bearer 0123456789abcdef0123", true),
            ("bearer 0123456789abcdef0123", true),
            ("BEARER  0123456789abcdef0123 ", true),
            ("Bearer 0123456789ABCDEF0123", false),
            ("Basic 0123456789abcdef0123", false),
            ("Bearer", false),
            ("0123456789abcdef0123", false),
        ] {
            assert_eq!(g.token.admits(value), admitted, "{value:?}");
        }
    }

    #[test]
    fn the_token_never_shows_in_debug() {
        assert_eq!(
            format!("{:?}", Token::new("secret-secret-secret")),
            "Token(<redacted>)"
        );
    }
}
