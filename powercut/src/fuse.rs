//! The FUSE front: each kernel request becomes one or two `Fs` calls on the
//! mount's [`SimFs`], the volatile layer.
//!
//! Invariant: a request changes the disk only through the `Fs` call named
//! after it (`write` → `write_at`, `fsync` → `sync`, `fsyncdir` →
//! `sync_dir`, `create` → `open`, `mkdir` → `create_dir_all`, `unlink` →
//! `remove`, `rename` → `rename`, `setattr(size)` → `truncate`), so what is
//! durable is what SimFs says is durable. Once the power is cut every
//! request fails with EIO and changes nothing: the cut is the last thing
//! that happens to this mount's disk.

use std::ffi::OsStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use durable_agent::fs::{Fs, OpenMode, SimFs};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::errno::errno;
use crate::inodes::Inodes;

/// How long the kernel may cache an entry or attributes. Every change goes
/// through this mount's kernel client, so its cache cannot go stale; a cut
/// ends the mount, and with it the cache.
const TTL: Duration = Duration::from_secs(1);

/// Largest read answered at once (the kernel asks for at most 128 KiB).
const MAX_READ_BYTES: u32 = 1 << 20;

const O_EXCL: i32 = 0o200;
const O_TRUNC: i32 = 0o1000;

/// What the mount and its FUSE session share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sim: SimFs,
    pub(crate) state: Mutex<State>,
    pub(crate) owner: (u32, u32),
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) inodes: Inodes,
    /// False once the power is cut.
    pub(crate) powered: bool,
}

impl Shared {
    pub(crate) fn new(sim: SimFs, owner: (u32, u32)) -> Arc<Self> {
        Arc::new(Shared {
            sim,
            state: Mutex::new(State {
                inodes: Inodes::new(),
                powered: true,
            }),
            owner,
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic in a request leaves the table consistent between
        // requests; keep serving rather than hang the kernel.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The `fuser::Filesystem` over [`Shared`].
pub(crate) struct PowerCutFs(pub(crate) Arc<Shared>);

/// What a request sees of one path.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Dir,
    File(u64),
}

impl PowerCutFs {
    /// Lock the state for one request; EIO once the power is cut.
    fn begin(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = self.0.lock();
        if state.powered {
            Ok(state)
        } else {
            Err(Errno::EIO)
        }
    }

    fn kind(&self, path: &Path) -> io::Result<Kind> {
        match self.0.sim.list(path, "fuse getattr") {
            Ok(_) => Ok(Kind::Dir),
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                Ok(Kind::File(self.0.sim.len(path, "fuse getattr")?))
            }
            Err(e) => Err(e),
        }
    }

    fn attr(&self, ino: u64, kind: Kind) -> FileAttr {
        let (file_type, size, perm, nlink) = match kind {
            Kind::Dir => (FileType::Directory, 0, 0o755, 2),
            Kind::File(len) => (FileType::RegularFile, len, 0o644, 1),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: file_type,
            perm,
            nlink,
            uid: self.0.owner.0,
            gid: self.0.owner.1,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// The attributes of `path` under a (new or known) inode number.
    fn entry(&self, state: &mut State, path: &Path) -> Result<FileAttr, Errno> {
        let kind = self.kind(path).map_err(|e| errno(&e))?;
        let ino = state.inodes.ino(path);
        Ok(self.attr(ino, kind))
    }

    fn path_of(state: &State, ino: INodeNo) -> Result<PathBuf, Errno> {
        state
            .inodes
            .path(ino.0)
            .map(Path::to_path_buf)
            .ok_or(Errno::ENOENT)
    }

    fn child(state: &State, parent: INodeNo, name: &OsStr) -> Result<PathBuf, Errno> {
        Ok(Self::path_of(state, parent)?.join(name))
    }

    fn lookup_inner(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let mut state = self.begin()?;
        let path = Self::child(&state, parent, name)?;
        self.entry(&mut state, &path)
    }

    fn getattr_inner(&self, ino: INodeNo) -> Result<FileAttr, Errno> {
        let mut state = self.begin()?;
        let path = Self::path_of(&state, ino)?;
        self.entry(&mut state, &path)
    }

    fn setattr_inner(&self, ino: INodeNo, size: Option<u64>) -> Result<FileAttr, Errno> {
        let mut state = self.begin()?;
        let path = Self::path_of(&state, ino)?;
        if let Some(len) = size {
            self.0
                .sim
                .truncate(&path, len, "fuse setattr size")
                .map_err(|e| errno(&e))?;
        }
        self.entry(&mut state, &path)
    }

    fn mkdir_inner(&self, parent: INodeNo, name: &OsStr) -> Result<FileAttr, Errno> {
        let mut state = self.begin()?;
        let path = Self::child(&state, parent, name)?;
        if self.kind(&path).is_ok() {
            return Err(Errno::EEXIST);
        }
        self.0
            .sim
            .create_dir_all(&path, "fuse mkdir")
            .map_err(|e| errno(&e))?;
        self.entry(&mut state, &path)
    }

    fn create_inner(&self, parent: INodeNo, name: &OsStr, flags: i32) -> Result<FileAttr, Errno> {
        let mut state = self.begin()?;
        let path = Self::child(&state, parent, name)?;
        let mode = if flags & O_EXCL != 0 {
            OpenMode::CreateNew
        } else if flags & O_TRUNC != 0 {
            OpenMode::Truncate
        } else {
            OpenMode::Create
        };
        self.0
            .sim
            .open(&path, mode, "fuse create")
            .map_err(|e| errno(&e))?;
        self.entry(&mut state, &path)
    }

    fn unlink_inner(&self, parent: INodeNo, name: &OsStr) -> Result<(), Errno> {
        let mut state = self.begin()?;
        let path = Self::child(&state, parent, name)?;
        self.0.sim.remove(&path, "fuse unlink").map_err(|e| errno(&e))?;
        state.inodes.remove(&path);
        Ok(())
    }

    fn rename_inner(
        &self,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
    ) -> Result<(), Errno> {
        let mut state = self.begin()?;
        let from = Self::child(&state, parent, name)?;
        let to = Self::child(&state, newparent, newname)?;
        self.0
            .sim
            .rename(&from, &to, "fuse rename")
            .map_err(|e| errno(&e))?;
        state.inodes.rename(&from, &to);
        Ok(())
    }

    fn read_inner(&self, ino: INodeNo, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
        let state = self.begin()?;
        let path = Self::path_of(&state, ino)?;
        let mut buf = vec![0; size.min(MAX_READ_BYTES) as usize];
        let n = self
            .0
            .sim
            .read_at(&path, offset, &mut buf, "fuse read")
            .map_err(|e| errno(&e))?;
        buf.truncate(n);
        Ok(buf)
    }

    fn write_inner(&self, ino: INodeNo, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let state = self.begin()?;
        let path = Self::path_of(&state, ino)?;
        let written = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        self.0
            .sim
            .write_at(&path, offset, data, "fuse write")
            .map_err(|e| errno(&e))?;
        Ok(written)
    }

    fn fsync_inner(&self, ino: INodeNo, dir: bool) -> Result<(), Errno> {
        let state = self.begin()?;
        let path = Self::path_of(&state, ino)?;
        let result = if dir {
            self.0.sim.sync_dir(&path, "fuse fsyncdir")
        } else {
            self.0.sim.sync(&path, "fuse fsync")
        };
        result.map_err(|e| errno(&e))
    }

    /// `(ino, kind, name)` of `.`, `..` and every child, in name order.
    fn readdir_inner(&self, ino: INodeNo) -> Result<Vec<(u64, FileType, String)>, Errno> {
        let mut state = self.begin()?;
        let path = Self::path_of(&state, ino)?;
        let names = self.0.sim.list(&path, "fuse readdir").map_err(|e| errno(&e))?;
        let parent = path.parent().map(|p| state.inodes.ino(p)).unwrap_or(ino.0);
        let mut out = vec![
            (ino.0, FileType::Directory, ".".to_owned()),
            (parent, FileType::Directory, "..".to_owned()),
        ];
        for name in names {
            let child = path.join(&name);
            let kind = match self.kind(&child).map_err(|e| errno(&e))? {
                Kind::Dir => FileType::Directory,
                Kind::File(_) => FileType::RegularFile,
            };
            out.push((state.inodes.ino(&child), kind, name));
        }
        Ok(out)
    }
}

impl fuser::Filesystem for PowerCutFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.lookup_inner(parent, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.getattr_inner(ino) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // Mode, owner and times are not modelled (see the crate doc).
        match self.setattr_inner(ino, size) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        match self.mkdir_inner(parent, name) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.unlink_inner(parent, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        // The seam has no directory removal, so SimFs models none.
        reply.error(Errno::EPERM);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            // RENAME_NOREPLACE / RENAME_EXCHANGE are not modelled.
            reply.error(Errno::EINVAL);
            return;
        }
        match self.rename_inner(parent, name, newparent, newname) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // O_TRUNC arrives as a separate setattr(size = 0).
        match self.getattr_inner(ino) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.read_inner(ino, offset, size) {
            Ok(data) => reply.data(&data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.write_inner(ino, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fsync_inner(ino, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        match self.readdir_inner(ino) {
            Ok(entries) => {
                let start = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(start) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.fsync_inner(ino, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        match self.getattr_inner(ino) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        match self.create_inner(parent, name, flags) {
            Ok(attr) => reply.created(&TTL, &attr, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }
}
