//! The root manifest, `{root}/root.json`: written once, when the root's
//! store first exists, with the store's identity (`PRAGMA application_id`
//! of `store.db`). A root with a manifest had a store: a missing `store.db`,
//! or one with another identity (emptied, or replaced by another root's),
//! is damage outside the crash model, refused — never recreated, because a
//! fresh store would forget every trigger, run and side effect and fire
//! a deduplicated trigger again.
//!
//! Invariant: the manifest is written atomically (`root.json.tmp`, fsync,
//! rename, fsync the root) after the store's identity is committed and
//! the store's directory entry is durable, so a crash leaves either no
//! manifest (the next boot writes it from the store) or a whole one that
//! names a store that exists. A manifest is read version first: one a
//! newer build wrote is [`ManifestError::NewerSchema`] whatever its shape
//! (not damage: never quarantined, never rewritten).

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::fs::{Fs, OpenMode};

/// The manifest's file name under the root.
pub const MANIFEST_FILE: &str = "root.json";
const MANIFEST_TMP: &str = "root.json.tmp";
/// Version of the manifest's format.
pub const MANIFEST_VERSION: u32 = 1;

/// `root.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// `store.db`'s `PRAGMA application_id` (never 0).
    pub store_id: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("{step} on {}: {source} (outcome unknown: reopen to recover)", path.display())]
    Io {
        path: PathBuf,
        step: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{}: not a root manifest: {reason} (restore it from a backup; see docs/OPERATING.md)", path.display())]
    Invalid { path: PathBuf, reason: String },
    /// `root.json` was written by a newer version of durable-agent: not
    /// damage, so never quarantined (nor rewritten); an upgrade reads it.
    #[error(
        "{}: schema_version {found}, newer than the supported {supported}: upgrade durable-agent to \
         read this root (nothing was changed)",
        path.display()
    )]
    NewerSchema {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
}

impl ManifestError {
    /// The file the error is about (`root.json`, or its `.tmp`).
    pub fn path(&self) -> &Path {
        match self {
            ManifestError::Io { path, .. }
            | ManifestError::Invalid { path, .. }
            | ManifestError::NewerSchema { path, .. } => path,
        }
    }
}

/// The `schema_version` of a manifest, read alone: the member every
/// version writes, so a newer build's manifest, whatever else it holds, is
/// known as newer before the rest is fitted to this build's shape.
fn manifest_version(bytes: &[u8]) -> Result<u32, serde_json::Error> {
    #[derive(Deserialize)]
    struct Probe {
        schema_version: u32,
    }
    serde_json::from_slice::<Probe>(bytes).map(|p| p.schema_version)
}

/// Read `{root}/root.json`; `None` if there is none. A manifest a newer
/// build wrote is [`ManifestError::NewerSchema`], whatever its shape; one
/// that does not parse (or names no store) is [`ManifestError::Invalid`].
pub fn read(fs: &dyn Fs, root: &Path) -> Result<Option<Manifest>, ManifestError> {
    let path = root.join(MANIFEST_FILE);
    let bytes = match fs.read(&path, "root.json read") {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ManifestError::Io {
                path,
                step: "read",
                source,
            })
        }
    };
    let invalid = |reason: String| ManifestError::Invalid {
        path: path.clone(),
        reason,
    };
    let version = manifest_version(&bytes).map_err(|e| invalid(e.to_string()))?;
    if version > MANIFEST_VERSION {
        return Err(ManifestError::NewerSchema {
            path,
            found: version,
            supported: MANIFEST_VERSION,
        });
    }
    let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| invalid(e.to_string()))?;
    if manifest.store_id == 0 {
        return Err(invalid(format!(
            "store_id 0 (schema_version {})",
            manifest.schema_version
        )));
    }
    Ok(Some(manifest))
}

/// A store the operator declared lost (`durable-agent repair --quarantine
/// --accept-store-loss`): kept in `root.json` beside the current identity,
/// so the root says for good that its dedup keys and side-effect ledger
/// before that moment were forgotten.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostStore {
    /// The lost store's identity (what `store_id` was).
    pub store_id: u32,
    /// When the loss was accepted (ms since the UNIX epoch, host clock).
    pub accepted_at_ms: u64,
    /// Where what was left of it went (relative to the root), if anything.
    pub quarantined_to: Option<String>,
}

/// `root.json` with its history of lost stores (older readers ignore the
/// field; [`read`] does too).
#[derive(Debug, Serialize, Deserialize)]
struct WithHistory {
    #[serde(flatten)]
    manifest: Manifest,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    lost_stores: Vec<LostStore>,
}

/// The stores `{root}/root.json` records as lost (empty without a
/// manifest or a history).
pub fn read_lost(fs: &dyn Fs, root: &Path) -> Result<Vec<LostStore>, ManifestError> {
    let path = root.join(MANIFEST_FILE);
    let bytes = match fs.read(&path, "root.json read (history)") {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ManifestError::Io {
                path,
                step: "read",
                source,
            })
        }
    };
    let found: WithHistory = serde_json::from_slice(&bytes).map_err(|e| ManifestError::Invalid {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    Ok(found.lost_stores)
}

/// Write `manifest` to `{root}/root.json` atomically (see the module doc).
pub fn write(fs: &dyn Fs, root: &Path, manifest: &Manifest) -> Result<(), ManifestError> {
    write_with_history(fs, root, manifest, &[])
}

/// [`write`], recording `lost` stores beside the identity.
pub fn write_with_history(
    fs: &dyn Fs,
    root: &Path,
    manifest: &Manifest,
    lost: &[LostStore],
) -> Result<(), ManifestError> {
    let tmp = root.join(MANIFEST_TMP);
    let path = root.join(MANIFEST_FILE);
    let io = |path: &Path, step: &'static str| {
        let path = path.to_path_buf();
        move |source| ManifestError::Io { path, step, source }
    };
    let on_disk = WithHistory {
        manifest: *manifest,
        lost_stores: lost.to_vec(),
    };
    let mut line = serde_json::to_vec(&on_disk).map_err(|e| ManifestError::Invalid {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    line.push(b'\n');
    // The store's own directory entry first: the manifest must never be
    // durable without the store it names.
    fs.sync_dir(root, "root dir fsync (before root.json)")
        .map_err(io(root, "dir fsync"))?;
    fs.open(&tmp, OpenMode::Truncate, "root.json.tmp create")
        .map_err(io(&tmp, "create"))?;
    fs.write_at(&tmp, 0, &line, "root.json.tmp write")
        .map_err(io(&tmp, "write"))?;
    fs.sync(&tmp, "root.json.tmp fsync").map_err(io(&tmp, "fsync"))?;
    fs.rename(&tmp, &path, "root.json rename")
        .map_err(io(&path, "rename"))?;
    fs.sync_dir(root, "root dir fsync (root.json)")
        .map_err(io(root, "dir fsync"))?;
    Ok(())
}
