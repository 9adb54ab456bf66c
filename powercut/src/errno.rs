//! Seam errors to the errno the kernel hands the program.
//!
//! Invariant: an error never maps to `ENOSYS` — the kernel would take it
//! as "not implemented" and stop sending that request (a `fsync` that
//! returned ENOSYS once is never sent again, which would silently turn
//! every later fsync into a no-op).

use std::io;

use fuser::Errno;

pub(crate) fn errno(error: &io::Error) -> Errno {
    use io::ErrorKind as K;
    if let Some(raw) = error.raw_os_error() {
        if raw > 0 && raw != libc_enosys() {
            return Errno::from_i32(raw);
        }
    }
    match error.kind() {
        K::NotFound => Errno::ENOENT,
        K::AlreadyExists => Errno::EEXIST,
        K::NotADirectory => Errno::ENOTDIR,
        K::IsADirectory => Errno::EISDIR,
        K::DirectoryNotEmpty => Errno::ENOTEMPTY,
        K::StorageFull => Errno::ENOSPC,
        K::FileTooLarge => Errno::EFBIG,
        K::InvalidInput => Errno::EINVAL,
        K::PermissionDenied => Errno::EACCES,
        // SimFs renames files only: EXDEV makes `mv` copy instead, and
        // tells a program plainly that this rename is not available.
        K::Unsupported => Errno::EXDEV,
        _ => Errno::EIO,
    }
}

/// ENOSYS on Linux (asm-generic/errno.h); spelled out to avoid a libc
/// dependency for one constant.
const fn libc_enosys() -> i32 {
    38
}
