//! SimFs throughput: the crash sweeps run millions of I/O points, so the
//! per-op cost of the fault model (logs, trace, locking) matters.
//!
//! Run: `cargo bench --bench simfs -- --quick`

use std::hint::black_box;
use std::path::{Path, PathBuf};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use durable_agent::fs::{CrashMode, DirModel, Fs, OpenMode, SimConfig, SimFs};

const OPS: u64 = 1_000;

fn fresh_with_file(path: &Path) -> SimFs {
    let fs = SimFs::new(SimConfig::new(42));
    fs.create_dir_all(Path::new("/d"), "mkdir").unwrap();
    fs.open(path, OpenMode::Create, "create").unwrap();
    fs
}

/// The event-log pattern: append a record, fsync every fourth.
fn append_sync_mix(c: &mut Criterion) {
    let path = PathBuf::from("/d/events.jsonl");
    let record = [b'x'; 120];
    let mut group = c.benchmark_group("simfs");
    group.throughput(Throughput::Elements(OPS));
    group.bench_function("append_sync_mix_1000_ops", |b| {
        b.iter_batched(
            || fresh_with_file(&path),
            |fs| {
                for i in 0..OPS {
                    if i % 4 == 3 {
                        fs.sync(&path, "events sync").unwrap();
                    } else {
                        black_box(fs.append(&path, &record, "events append").unwrap());
                    }
                }
                fs
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// The SQLite pattern: 4 KiB pages at scattered offsets, a sync per 32.
fn write_at_pages(c: &mut Criterion) {
    let path = PathBuf::from("/d/db.sqlite");
    let page = [7u8; 4096];
    let mut group = c.benchmark_group("simfs");
    group.throughput(Throughput::Elements(OPS));
    group.bench_function("write_at_4k_1000_ops", |b| {
        b.iter_batched(
            || fresh_with_file(&path),
            |fs| {
                for i in 0..OPS {
                    let page_no = (i * 7919) % 256;
                    fs.write_at(&path, page_no * 4096, &page, "db page write")
                        .unwrap();
                    if i % 32 == 31 {
                        fs.sync(&path, "db sync").unwrap();
                    }
                }
                fs
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// 100 files, each with synced and unsynced data, half of them with
/// undecided directory entries.
fn hundred_file_disk() -> SimFs {
    let fs = SimFs::new(SimConfig::new(7));
    fs.create_dir_all(Path::new("/d"), "mkdir").unwrap();
    fs.sync_dir(Path::new("/"), "sync root").unwrap();
    for i in 0..100 {
        let path = PathBuf::from(format!("/d/f{i:03}"));
        fs.open(&path, OpenMode::Create, "create").unwrap();
        fs.append(&path, &[b's'; 2048], "synced append").unwrap();
        fs.sync(&path, "sync").unwrap();
        if i == 49 {
            fs.sync_dir(Path::new("/d"), "sync d").unwrap();
        }
        for _ in 0..4 {
            fs.append(&path, &[b'u'; 512], "unsynced append").unwrap();
        }
    }
    fs
}

fn power_loss_restart(c: &mut Criterion) {
    let mut group = c.benchmark_group("simfs");
    group.throughput(Throughput::Elements(1));
    group.bench_function("power_loss_restart_100_files", |b| {
        b.iter_batched(
            hundred_file_disk,
            |fs| {
                fs.restart(CrashMode::PowerLoss(DirModel::Strict));
                fs
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// The WAL after a fork: capture mode keeps every point's crash image,
/// each sharing the file, and the run keeps appending 4 KiB frames to a
/// file of ~1 MiB. Each frame used to copy the whole file.
fn append_after_capture(c: &mut Criterion) {
    let path = PathBuf::from("/d/store.db-wal");
    let frame = [9u8; 4120];
    let mut group = c.benchmark_group("simfs");
    group.throughput(Throughput::Elements(100));
    group.bench_function("wal_append_100_frames_captured_1mib", |b| {
        b.iter_batched(
            || {
                let fs = fresh_with_file(&path);
                for _ in 0..256 {
                    fs.append(&path, &frame, "wal frame").unwrap();
                }
                fs.sync(&path, "wal sync").unwrap();
                fs.set_capture(true);
                fs
            },
            |fs| {
                for _ in 0..100 {
                    fs.append(&path, &frame, "wal frame").unwrap();
                }
                black_box(fs.take_captures().len());
                fs
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(
    benches,
    append_sync_mix,
    write_at_pages,
    power_loss_restart,
    append_after_capture
);
criterion_main!(benches);
