//! The disk at rest: a backing directory loaded into a fresh [`SimFs`] at
//! mount, and a [`SimFs`]'s view written back to it after a cut.
//!
//! Invariant: `load` then `store` with nothing in between writes back the
//! same tree (every directory, every file byte for byte); everything
//! `load` puts in the SimFs is durable (synced and dir-synced), because
//! the backing directory *is* the disk a power cut left.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use durable_agent::fs::{Fs, OpenMode, SimConfig, SimFs};

use crate::mount::PowerCutError;

fn backing_err(path: &Path, step: &'static str) -> impl FnOnce(io::Error) -> PowerCutError {
    let path = path.to_path_buf();
    move |source| PowerCutError::Backing { path, step, source }
}

/// A SimFs whose whole durable image is the tree under `backing`, mapped
/// to `/`.
pub(crate) fn load(backing: &Path, config: SimConfig) -> Result<SimFs, PowerCutError> {
    let sim = SimFs::new(config);
    let mut dirs = vec![(backing.to_path_buf(), PathBuf::from("/"))];
    let mut i = 0;
    while i < dirs.len() {
        let (real, virt) = dirs[i].clone();
        i += 1;
        let mut entries: Vec<_> = fs::read_dir(&real)
            .map_err(backing_err(&real, "list"))?
            .collect::<io::Result<_>>()
            .map_err(backing_err(&real, "list"))?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let (real_child, virt_child) = (entry.path(), virt.join(entry.file_name()));
            let kind = entry.file_type().map_err(backing_err(&real_child, "stat"))?;
            if kind.is_dir() {
                sim.create_dir_all(&virt_child, "powercut load mkdir")
                    .map_err(backing_err(&real_child, "load into SimFs"))?;
                dirs.push((real_child, virt_child));
            } else {
                let bytes = fs::read(&real_child).map_err(backing_err(&real_child, "read"))?;
                let into_sim = || -> io::Result<()> {
                    sim.open(&virt_child, OpenMode::CreateNew, "powercut load create")?;
                    sim.write_at(&virt_child, 0, &bytes, "powercut load write")?;
                    sim.sync(&virt_child, "powercut load sync")
                };
                into_sim().map_err(backing_err(&real_child, "load into SimFs"))?;
            }
        }
        sim.sync_dir(&virt, "powercut load sync_dir")
            .map_err(backing_err(&real, "load into SimFs"))?;
    }
    Ok(sim)
}

/// Replace the tree under `backing` with what `sim` shows the process.
pub(crate) fn store(sim: &SimFs, backing: &Path) -> Result<(), PowerCutError> {
    // Write the new tree beside the old one and swap, so an error half way
    // leaves the previous disk whole.
    let parent = backing.parent().unwrap_or(Path::new("/"));
    let name = backing.file_name().unwrap_or_default().to_string_lossy();
    let fresh = parent.join(format!(".{name}.powercut-new"));
    if fresh.exists() {
        fs::remove_dir_all(&fresh).map_err(backing_err(&fresh, "remove stale copy"))?;
    }
    fs::create_dir(&fresh).map_err(backing_err(&fresh, "mkdir"))?;
    let mut dirs = vec![PathBuf::from("/")];
    while let Some(virt) = dirs.pop() {
        let names = sim
            .list(&virt, "powercut store list")
            .map_err(backing_err(&virt, "list SimFs"))?;
        for name in names {
            let virt_child = virt.join(&name);
            let real_child = fresh.join(virt_child.strip_prefix("/").unwrap_or(&virt_child));
            match sim.list(&virt_child, "powercut store kind") {
                Ok(_) => {
                    fs::create_dir(&real_child).map_err(backing_err(&real_child, "mkdir"))?;
                    dirs.push(virt_child);
                }
                Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                    let bytes = sim
                        .read(&virt_child, "powercut store read")
                        .map_err(backing_err(&virt_child, "read SimFs"))?;
                    fs::write(&real_child, bytes).map_err(backing_err(&real_child, "write"))?;
                }
                Err(e) => return Err(backing_err(&virt_child, "stat SimFs")(e)),
            }
        }
    }
    if backing.exists() {
        fs::remove_dir_all(backing).map_err(backing_err(backing, "remove old disk"))?;
    }
    fs::rename(&fresh, backing).map_err(backing_err(backing, "install new disk"))?;
    Ok(())
}
