//! The `read_file` builtin: a file under one workspace directory.
//!
//! Invariant: only files whose canonical path (symlinks resolved) lies
//! under the canonical workspace are read; `..`, absolute paths and
//! symlinks pointing outside are refused as a normal tool failure. (A
//! symlink swapped between the check and the open is outside this threat
//! model: the adversary here is the model's arguments, not a local user.)

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use crate::config::ReadFileToolConfig;

#[derive(Debug)]
pub struct ReadFile {
    workspace: PathBuf,
    max_bytes: u64,
}

impl ReadFile {
    pub fn new(tool: &ReadFileToolConfig) -> Self {
        ReadFile {
            workspace: tool.workspace.clone(),
            max_bytes: tool.max_bytes,
        }
    }

    /// The file's text (lossy UTF-8, cut at `max_bytes`), or why not.
    pub fn read(&self, relative: &str) -> Result<String, String> {
        let rel = Path::new(relative);
        if relative.is_empty() {
            return Err("`path` is empty".into());
        }
        if rel.is_absolute() || rel.has_root() {
            return Err(format!(
                "{relative:?} is absolute; give a path inside the workspace"
            ));
        }
        if rel
            .components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(format!("{relative:?} leaves the workspace (`..` is not allowed)"));
        }
        // Canonicalized at call time: the workspace may be created after
        // the config was loaded.
        let root = self
            .workspace
            .canonicalize()
            .map_err(|e| format!("workspace {} unavailable: {e}", self.workspace.display()))?;
        let target = root
            .join(rel)
            .canonicalize()
            .map_err(|e| format!("{relative}: {e}"))?;
        if !target.starts_with(&root) {
            return Err(format!("{relative:?} resolves outside the workspace (symlink)"));
        }
        if !target.is_file() {
            return Err(format!("{relative:?} is not a regular file"));
        }
        let file = std::fs::File::open(&target).map_err(|e| format!("{relative}: {e}"))?;
        let mut bytes = Vec::new();
        file.take(self.max_bytes + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{relative}: {e}"))?;
        let truncated = bytes.len() as u64 > self.max_bytes;
        if truncated {
            bytes.truncate(usize::try_from(self.max_bytes).unwrap_or(usize::MAX));
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if truncated {
            text.push_str(&format!("\n[truncated at {} bytes]", self.max_bytes));
        }
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(dir: &Path, max_bytes: u64) -> ReadFile {
        ReadFile {
            workspace: dir.to_path_buf(),
            max_bytes,
        }
    }

    #[test]
    fn reads_inside_and_refuses_escapes() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let ws = tmp.path().join("ws");
        std::fs::create_dir_all(ws.join("sub"))?;
        std::fs::write(ws.join("sub/a.txt"), "hello")?;
        std::fs::write(tmp.path().join("secret"), "s3cret")?;
        let t = tool(&ws, 1024);
        assert_eq!(t.read("sub/a.txt"), Ok("hello".into()));
        assert_eq!(t.read("./sub/a.txt"), Ok("hello".into()));
        assert!(t.read("../secret").unwrap_err().contains("leaves the workspace"));
        assert!(t
            .read("sub/../../secret")
            .unwrap_err()
            .contains("leaves the workspace"));
        let abs = tmp.path().join("secret");
        assert!(t.read(&abs.to_string_lossy()).unwrap_err().contains("absolute"));
        assert!(t.read("missing").is_err());
        assert!(t.read("sub").unwrap_err().contains("not a regular file"));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(tmp.path().join("secret"), ws.join("link"))?;
            assert!(t.read("link").unwrap_err().contains("outside the workspace"));
        }
        Ok(())
    }

    #[test]
    fn large_files_are_cut_at_the_limit() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        std::fs::write(tmp.path().join("big"), "0123456789")?;
        let text = tool(tmp.path(), 4).read("big").expect("readable");
        assert_eq!(text, "0123\n[truncated at 4 bytes]");
        Ok(())
    }
}
