//! `sweep --report FILE.html`: a picture of one sweep. The I/O points of the
//! sequence run along one axis (wrapped into strips), the crash modes along
//! the other; each cell is one (point, mode) the sweep judged, coloured by
//! its verdict (accepted as before / after the interrupted op, or failed);
//! op boundaries are marked; hovering a cell shows its I/O label, the op it
//! belongs to and the trace around it; a failing cell links to its repro
//! command, listed beside the grid. One self-contained file: inline CSS and
//! script, no network.
//!
//! Invariant: the page holds exactly one cell per (point, mode) the sweep
//! judged, with that verdict, and embeds the same data as JSON
//! (`<script type="application/json" id="sweep-data">`, a [`SweepMap`]),
//! so a test can read back what the picture shows and compare it with the
//! sweep (`sim/tests/sweep_report.rs`). The verdicts are the sweep's own
//! ([`sweep_points`], fork method); the labels come from a second crash-free
//! dry run of the same sequence, which crosses the same points.

use std::fmt::Write as _;
use std::ops::ControlFlow;

use durable_agent::canary::Canaries;
use serde::{Deserialize, Serialize};

use crate::exec::Exec;
use crate::op::{render, CrashKind, Op};
use crate::oracle::Side;
use crate::report::Failure;
use crate::sweep::{sweep_points, SweepOptions, SweepSummary};

/// The id of the embedded JSON block.
pub const DATA_ID: &str = "sweep-data";

/// Points per strip of the picture.
const STRIP: usize = 100;

/// Trace entries shown on each side of a hovered point.
const HOVER_CONTEXT: usize = 4;

/// How one (point, mode) was judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Recovered as the model before the interrupted op.
    Before,
    /// Recovered as the model after it (or, between ops, the one state).
    After,
    Failed,
    /// The point was not reached (only a replay can end before its point).
    NotHit,
}

impl Verdict {
    pub fn class(self) -> &'static str {
        match self {
            Verdict::Before => "v-before",
            Verdict::After => "v-after",
            Verdict::Failed => "v-failed",
            Verdict::NotHit => "v-nothit",
        }
    }
}

/// One I/O point of the dry run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PointInfo {
    pub point: u64,
    /// The caller's label (`events.jsonl append turn.start`).
    pub label: String,
    /// The `Fs` operation (`Append`, `Sync`, ...).
    pub io: String,
    pub path: String,
    /// The op it belongs to: 0 = the install and first boot, k = op #k.
    pub op: usize,
}

/// One op of the sequence and the points it crossed (`first..=last`;
/// `first > last` when it did no I/O).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpSpan {
    /// 0 = the install and first boot, k = op #k.
    pub index: usize,
    pub text: String,
    pub first: u64,
    pub last: u64,
}

/// One judged (point, mode).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cell {
    pub point: u64,
    pub mode: CrashKind,
    pub verdict: Verdict,
}

/// A failing cell's headline and the command that replays it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CellFailure {
    pub point: u64,
    pub mode: CrashKind,
    pub what: String,
    pub repro: String,
}

/// Everything the picture shows (and embeds as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SweepMap {
    pub seed: u64,
    pub canaries: Canaries,
    pub modes: Vec<CrashKind>,
    pub points: Vec<PointInfo>,
    pub ops: Vec<OpSpan>,
    /// Point-major, modes in `modes` order.
    pub cells: Vec<Cell>,
    pub failures: Vec<CellFailure>,
}

/// Sweep `ops` (fork method, every point, every mode in `kinds`, all
/// failures collected) and map it. Also returns the sweep's summary (its
/// failures with full reports). `Err`: the dry run itself failed.
pub fn map_sweep(
    seed: u64,
    ops: &[Op],
    canaries: &Canaries,
    kinds: &[CrashKind],
) -> Result<(SweepMap, SweepSummary), Box<Failure>> {
    // The sweep drops `Op::Crash` (it places the crashes): so do we, so op
    // numbers here are the sweep's.
    let ops: Vec<Op> = ops
        .iter()
        .filter(|op| !matches!(op, Op::Crash { .. }))
        .cloned()
        .collect();
    let (points, spans) = dry_run(seed, &ops, canaries)?;
    let options = SweepOptions {
        kinds: kinds.to_vec(),
        ..SweepOptions::default()
    };
    let mut summary = SweepSummary::default();
    let mut cells = Vec::new();
    let mut failures = Vec::new();
    summary.points = sweep_points(seed, &ops, canaries, &options, |v| {
        summary.runs += 1;
        summary.crashes += u64::from(v.hit);
        let verdict = match (&v.outcome, v.side) {
            (Err(f), _) => {
                failures.push(CellFailure {
                    point: v.point,
                    mode: v.kind,
                    what: f.what.clone(),
                    repro: f.repro_command(),
                });
                Verdict::Failed
            }
            _ if !v.hit => Verdict::NotHit,
            (Ok(_), Some(Side::Before)) => Verdict::Before,
            (Ok(_), _) => Verdict::After,
        };
        cells.push(Cell {
            point: v.point,
            mode: v.kind,
            verdict,
        });
        if let Err(f) = v.outcome {
            summary.failures.push(f);
        }
        ControlFlow::Continue(())
    })?;
    // Point-major, modes in the order asked (the fork sweep visits point by
    // point already; a replay sweep visits mode by mode).
    let rank = |k: CrashKind| kinds.iter().position(|&m| m == k).unwrap_or(usize::MAX);
    cells.sort_by_key(|c| (c.point, rank(c.mode)));
    failures.sort_by_key(|f| (f.point, rank(f.mode)));
    let map = SweepMap {
        seed,
        canaries: canaries.clone(),
        modes: kinds.to_vec(),
        points,
        ops: spans,
        cells,
        failures,
    };
    Ok((map, summary))
}

/// A crash-free capturing run (the sweep's own dry run, which performs the
/// install): every point's label, and where each op starts and ends.
fn dry_run(
    seed: u64,
    ops: &[Op],
    canaries: &Canaries,
) -> Result<(Vec<PointInfo>, Vec<OpSpan>), Box<Failure>> {
    let mut exec = Exec::capturing(seed, canaries.clone())?;
    drop(exec.take_forks()); // only the labels are wanted
    let mut spans = vec![OpSpan {
        index: 0,
        text: "install + first boot".into(),
        first: 1,
        last: exec.stats().points,
    }];
    for (i, op) in ops.iter().enumerate() {
        let first = exec.stats().points + 1;
        exec.step(op)?;
        drop(exec.take_forks());
        spans.push(OpSpan {
            index: i + 1,
            text: render(op),
            first,
            last: exec.stats().points,
        });
    }
    let op_of = |p: u64| {
        spans
            .iter()
            .find(|s| s.first <= p && p <= s.last)
            .map_or(0, |s| s.index)
    };
    let points = exec
        .trace()
        .into_iter()
        .map(|e| PointInfo {
            point: e.point,
            op: op_of(e.point),
            label: e.label,
            io: format!("{:?}", e.op),
            path: e.path,
        })
        .collect();
    Ok((points, spans))
}

/// `s` safe inside HTML text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The mode's serde name (`process`, `power_strict`, `power_eager`,
/// `power_rot`): what
/// the cells' `data-m` and the JSON carry.
fn mode_name(k: CrashKind) -> &'static str {
    match k {
        CrashKind::Process => "process",
        CrashKind::PowerStrict => "power_strict",
        CrashKind::PowerEager => "power_eager",
        CrashKind::PowerRot => "power_rot",
    }
}

/// The row heading (the summary's names for the modes).
fn mode_title(k: CrashKind) -> &'static str {
    match k {
        CrashKind::Process => "ProcessCrash",
        CrashKind::PowerStrict => "PowerLoss(Strict)",
        CrashKind::PowerEager => "PowerLoss(Eager)",
        CrashKind::PowerRot => "PowerLoss+BitRot",
    }
}

/// The page. `title` goes in the heading (e.g. "the tour, seed 7").
pub fn render_html(map: &SweepMap, title: &str) -> String {
    let count = |v: Verdict| map.cells.iter().filter(|c| c.verdict == v).count();
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n\
         <title>durable-agent sweep: {t}</title>\n<style>{CSS}</style></head>\n<body>\n\
         <h1>Crash sweep: {t}</h1>\n<p class=\"meta\">seed {seed:#x} · canaries {can:?} · {ops} ops · \
         {points} I/O points × {modes} crash modes = {cells} crash points judged · \
         <span class=\"key v-before\"></span> accepted before: {b} · \
         <span class=\"key v-after\"></span> accepted after: {a} · \
         <span class=\"key v-failed\"></span> failed: {f}{nothit}</p>\n\
         <p class=\"meta\">Columns: I/O points in order, {STRIP} a strip; rows: crash modes. \
         A thick left edge marks the first point of an op; the strip's header names the op. \
         Hover a cell for its I/O label and the trace around it; a failing cell links to its repro command.</p>\n\
         <div class=\"layout\"><div class=\"grid\">\n",
        t = esc(title),
        seed = map.seed,
        can = map.canaries,
        ops = map.ops.len().saturating_sub(1),
        points = map.points.len(),
        modes = map.modes.len(),
        cells = map.cells.len(),
        b = count(Verdict::Before),
        a = count(Verdict::After),
        f = count(Verdict::Failed),
        nothit = match count(Verdict::NotHit) {
            0 => String::new(),
            n => format!(" · not hit: {n}"),
        },
    );
    // Lookup only; never iterated, so its order cannot leak into the page.
    let verdicts: std::collections::HashMap<(u64, CrashKind), Verdict> =
        map.cells.iter().map(|c| ((c.point, c.mode), c.verdict)).collect();
    let verdict_of = |point: u64, mode: CrashKind| verdicts.get(&(point, mode)).copied();
    for strip in map.points.chunks(STRIP) {
        h.push_str("<table class=\"strip\">\n<tr><th class=\"mode\"></th>");
        // Header: one cell per op run inside the strip, as wide as it.
        let mut i = 0;
        while i < strip.len() {
            let op = strip[i].op;
            let n = strip[i..].iter().take_while(|p| p.op == op).count();
            let text = map.ops.get(op).map(|s| s.text.as_str()).unwrap_or("?");
            // An op carried over from the previous strip gets no boundary.
            let starts_here = map.ops.get(op).is_some_and(|s| s.first == strip[i].point);
            let _ = write!(
                h,
                "<th class=\"op{}\" colspan=\"{n}\" title=\"op #{op}: {}\">#{op}</th>",
                if starts_here { "" } else { " cont" },
                esc(text)
            );
            i += n;
        }
        h.push_str("</tr>\n");
        for &mode in &map.modes {
            let _ = write!(h, "<tr><th class=\"mode\">{}</th>", mode_title(mode));
            for p in strip {
                let boundary = map.ops.get(p.op).is_some_and(|s| s.first == p.point);
                let verdict = verdict_of(p.point, mode).unwrap_or(Verdict::NotHit);
                let _ = write!(
                    h,
                    "<td class=\"c {}{}\" data-p=\"{}\" data-m=\"{}\" data-v=\"{}\" title=\"{}\">",
                    verdict.class(),
                    if boundary { " b" } else { "" },
                    p.point,
                    mode_name(mode),
                    verdict.class().trim_start_matches("v-"),
                    esc(&format!("point {} {}: {}", p.point, mode_title(mode), p.label)),
                );
                if verdict == Verdict::Failed {
                    let _ = write!(h, "<a href=\"#f-{}-{}\"></a>", p.point, mode_name(mode));
                }
                h.push_str("</td>");
            }
            h.push_str("</tr>\n");
        }
        h.push_str("</table>\n");
    }
    h.push_str("</div>\n<div class=\"side\">\n<div id=\"hover\"><b>Hover a cell</b></div>\n");
    let _ = writeln!(h, "<h2>Failing cells ({})</h2>", map.failures.len());
    if map.failures.is_empty() {
        h.push_str("<p>none: every crash point recovered to an accepted state.</p>\n");
    } else {
        h.push_str("<ol class=\"failures\">\n");
        for f in &map.failures {
            let label = map
                .points
                .get(f.point.saturating_sub(1) as usize)
                .map(|p| p.label.as_str())
                .unwrap_or("?");
            let _ = writeln!(
                h,
                "<li id=\"f-{p}-{m}\" data-p=\"{p}\" data-m=\"{m}\"><b>point {p} {m}</b> \"{l}\": {w}<br><code>{r}</code></li>",
                p = f.point,
                m = mode_name(f.mode),
                l = esc(label),
                w = esc(&f.what),
                r = esc(&f.repro),
            );
        }
        h.push_str("</ol>\n");
    }
    h.push_str("</div></div>\n");
    // `</` inside a script element would end it; `<\/` is the same JSON.
    let json = serde_json::to_string(map)
        .unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        .replace("</", "<\\/");
    let _ = write!(
        h,
        "<script type=\"application/json\" id=\"{DATA_ID}\">{json}</script>\n<script>const CONTEXT = {HOVER_CONTEXT};\n{SCRIPT}</script>\n</body></html>\n"
    );
    h
}

/// Read the embedded [`SweepMap`] back out of a page.
pub fn embedded_map(html: &str) -> Result<SweepMap, String> {
    let open = format!("<script type=\"application/json\" id=\"{DATA_ID}\">");
    let start = html
        .find(&open)
        .ok_or_else(|| format!("no <script id=\"{DATA_ID}\"> block"))?
        + open.len();
    let len = html[start..]
        .find("</script>")
        .ok_or_else(|| "the data block is not closed".to_string())?;
    serde_json::from_str(&html[start..start + len])
        .map_err(|e| format!("the data block is not a SweepMap: {e}"))
}

const CSS: &str = "
body{font:13px/1.4 system-ui,sans-serif;margin:12px;color:#222}
h1{font-size:18px;margin:0 0 4px} h2{font-size:14px;margin:10px 0 4px}
.meta{margin:2px 0;color:#444}
.layout{display:flex;gap:14px;align-items:flex-start}
.grid{flex:none}
.side{flex:1;min-width:320px;max-width:560px;position:sticky;top:8px}
table.strip{border-collapse:collapse;margin:0 0 8px;table-layout:fixed}
th.mode{font-weight:normal;text-align:right;padding:0 6px 0 0;width:96px;font-size:11px;white-space:nowrap}
th.op{font-weight:normal;font-size:10px;color:#555;overflow:hidden;white-space:nowrap;max-width:0;
  border-left:2px solid #222;text-align:left;padding:0 1px;height:14px}
th.op.cont{border-left:1px dashed #aaa;color:#999}
td.c{width:9px;min-width:9px;height:13px;padding:0;border:1px solid #fff}
td.c.b{border-left:2px solid #222}
td.c a{display:block;width:100%;height:100%}
td.c:hover{outline:2px solid #000}
.v-before{background:#4e79a7} .v-after{background:#59a14f} .v-failed{background:#e15759} .v-nothit{background:#bbb}
.key{display:inline-block;width:10px;height:10px;vertical-align:middle}
#hover{border:1px solid #ccc;padding:6px;min-height:120px;background:#fafafa;font-size:12px}
#hover pre{margin:4px 0 0;font-size:11px;white-space:pre-wrap}
ol.failures{padding-left:20px;font-size:12px} ol.failures code{font-size:11px;word-break:break-all}
ol.failures li:target{background:#fde2e2}
";

/// The hover panel: reads the embedded data (no network, no library).
const SCRIPT: &str = r#"
const map = JSON.parse(document.getElementById('sweep-data').textContent);
const fail = {};
for (const f of map.failures) fail[f.point + ' ' + f.mode] = f;
const hover = document.getElementById('hover');
function esc(s) { return String(s).replace(/[&<>"]/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c])); }
document.querySelectorAll('td.c').forEach(td => td.addEventListener('mouseenter', () => {
  const p = +td.dataset.p, m = td.dataset.m, info = map.points[p - 1];
  const op = map.ops[info.op];
  let trace = '';
  for (let q = Math.max(1, p - CONTEXT); q <= Math.min(map.points.length, p + CONTEXT); q++) {
    const e = map.points[q - 1];
    trace += (q === p ? '>> ' : '   ') + String(q).padStart(6) + ' ' + e.io.padEnd(9) + ' ' + e.label + '  ' + e.path + '\n';
  }
  const f = fail[p + ' ' + m];
  hover.innerHTML = '<b>point ' + p + ' · ' + esc(m) + ' · ' + esc(td.dataset.v) + '</b><br>' +
    'op #' + info.op + ': ' + esc(op ? op.text : '?') + '<br>I/O: ' + esc(info.io + ' ' + info.label) +
    ' on ' + esc(info.path) + (f ? '<br><b>' + esc(f.what) + '</b><br><code>' + esc(f.repro) + '</code>' : '') +
    '<pre>' + esc(trace) + '</pre>';
}));
"#;
