//! The built-in authenticator: the tokens of the configuration file,
//! reloaded when the file changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::http::HeaderMap;

use crate::auth::{
    AuthError, Authenticated, Authenticator, Principal, TokenConfigError, authenticate_by_hash,
    hash_token,
};
use crate::config::load_token_config;

/// The built-in authenticator: a TOML token file, watched for changes.
///
/// A background thread looks at the file every [`TokenFile::RECHECK`] and
/// reloads it when its modification time, size or inode changed, so
/// `token revoke` takes effect on a running server at once: new requests
/// are refused, and [`Authenticator::revocations`] fires so that streams,
/// held calls and sessions of a revoked token end (within about a second).
/// A file that changed but cannot be used is reported and the previous
/// tokens are kept. The thread ends with the last clone of the value.
#[derive(Debug)]
pub struct TokenFile {
    shared: Arc<TokenFileShared>,
}

#[derive(Debug)]
struct TokenFileShared {
    path: PathBuf,
    tokens: RwLock<HashMap<String, Principal>>,
    /// What the file looked like when last read.
    seen: Mutex<Option<FileStamp>>,
    /// Bumped on every reload.
    generation: tokio::sync::watch::Sender<u64>,
}

/// Modification time, size and (on Unix) inode: a rename or a rewrite changes one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<SystemTime>,
    len: u64,
    inode: u64,
}

impl FileStamp {
    fn of(path: &Path) -> Option<Self> {
        let meta = std::fs::metadata(path).ok()?;
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(&meta);
        #[cfg(not(unix))]
        let inode = 0;
        Some(Self {
            modified: meta.modified().ok(),
            len: meta.len(),
            inode,
        })
    }
}

impl TokenFile {
    /// How often the watcher thread looks at the file.
    pub const RECHECK: Duration = Duration::from_millis(250);

    /// Loads `path` and starts watching it.
    pub fn open(path: impl Into<PathBuf>) -> Result<Self, TokenConfigError> {
        let path = path.into();
        let stamp = FileStamp::of(&path);
        let tokens = load_token_config(&path)?.principals()?;
        let shared = Arc::new(TokenFileShared {
            path,
            tokens: RwLock::new(tokens),
            seen: Mutex::new(stamp),
            generation: tokio::sync::watch::Sender::new(0),
        });
        let weak = Arc::downgrade(&shared);
        let spawned = std::thread::Builder::new()
            .name("graph-relay-tokens".into())
            .spawn(move || {
                loop {
                    std::thread::sleep(Self::RECHECK);
                    let Some(shared) = weak.upgrade() else {
                        return;
                    };
                    shared.refresh();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot watch the token file; changes are read on the next request");
        }
        Ok(Self { shared })
    }

    /// How many times the file was reloaded since it was opened.
    pub fn reloads(&self) -> u64 {
        *self.shared.generation.borrow()
    }
}

impl TokenFileShared {
    /// Reloads the file if it changed since it was last read.
    fn refresh(&self) {
        let Ok(mut seen) = self.seen.lock() else {
            return;
        };
        let stamp = FileStamp::of(&self.path);
        if stamp == *seen {
            return;
        }
        *seen = stamp;
        match load_token_config(&self.path).and_then(|c| c.principals()) {
            Ok(tokens) => {
                if let Ok(mut current) = self.tokens.write() {
                    *current = tokens;
                }
                self.generation.send_modify(|g| *g += 1);
                tracing::info!(path = %self.path.display(), "token file reloaded");
            }
            Err(e) => {
                tracing::warn!(error = %e, "token file changed but cannot be used; keeping the previous tokens")
            }
        }
    }

    fn lookup(&self, token_sha256: &str) -> Result<Option<Principal>, AuthError> {
        let tokens = self
            .tokens
            .read()
            .map_err(|_| AuthError::Unavailable("token table poisoned".into()))?;
        Ok(tokens.get(token_sha256).cloned())
    }
}

#[async_trait]
impl Authenticator for TokenFile {
    async fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        self.shared
            .lookup(&hash_token(token))?
            .ok_or(AuthError::InvalidToken)
    }

    async fn authenticate_request(&self, headers: &HeaderMap) -> Result<Authenticated, AuthError> {
        authenticate_by_hash(self, headers, |hash| self.shared.lookup(hash)).await
    }

    fn revocations(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.shared.generation.subscribe())
    }

    async fn still_valid(&self, token_sha256: &str, principal: &Principal) -> bool {
        // A poisoned table cannot say; keep what is open.
        self.shared
            .tokens
            .read()
            .map_or(true, |tokens| tokens.get(token_sha256) == Some(principal))
    }
}
