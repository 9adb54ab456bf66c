//! `sweep --report`: the picture shows exactly the sweep it claims to. One
//! cell per (point, mode), each with the verdict the sweep itself gave,
//! op boundaries covering every point, and a failing cell's repro command
//! beside it.
//!
//! The page is read back two ways: its embedded JSON block, and its
//! `<td>` cells scanned as markup (the page's generator writes each cell
//! as one `<td ...>` tag with `data-p`, `data-m`, `data-v` attributes; a
//! full HTML parser would check no more than that, at a crate's cost).

use std::collections::BTreeMap;
use std::ops::ControlFlow;

use durable_agent::canary::{Canaries, Canary};
use durable_agent_sim::op::{CrashKind, Op};
use durable_agent_sim::oracle::Side;
use durable_agent_sim::sweep_report::{embedded_map, map_sweep, render_html, SweepMap, Verdict};
use durable_agent_sim::tour::tour;
use durable_agent_sim::{sweep_points, SweepOptions};

/// The attributes of every `<td ...>` tag with a `data-p` attribute.
fn cells_in(html: &str) -> Vec<BTreeMap<String, String>> {
    let mut out = Vec::new();
    let mut rest = html;
    while let Some(i) = rest.find("<td ") {
        let tag_end = rest[i..].find('>').expect("unclosed <td") + i;
        let tag = &rest[i + 4..tag_end];
        let mut attrs = BTreeMap::new();
        let mut t = tag;
        while let Some(eq) = t.find("=\"") {
            let name = t[..eq].trim().to_string();
            let close = t[eq + 2..].find('"').expect("unterminated attribute") + eq + 2;
            attrs.insert(name, t[eq + 2..close].to_string());
            t = &t[close + 1..];
        }
        if attrs.contains_key("data-p") {
            out.push(attrs);
        }
        rest = &rest[tag_end..];
    }
    out
}

fn mode_key(k: CrashKind) -> String {
    serde_json::to_value(k).unwrap().as_str().unwrap().to_string()
}

/// The sweep's own verdicts, asked independently of the report.
fn sweep_verdicts(
    seed: u64,
    ops: &[Op],
    canaries: &Canaries,
    kinds: &[CrashKind],
) -> BTreeMap<(u64, String), Verdict> {
    let options = SweepOptions {
        kinds: kinds.to_vec(),
        ..SweepOptions::default()
    };
    let mut out = BTreeMap::new();
    sweep_points(seed, ops, canaries, &options, |v| {
        let verdict = match (&v.outcome, v.side) {
            (Err(_), _) => Verdict::Failed,
            _ if !v.hit => Verdict::NotHit,
            (Ok(_), Some(Side::Before)) => Verdict::Before,
            (Ok(_), _) => Verdict::After,
        };
        out.insert((v.point, mode_key(v.kind)), verdict);
        ControlFlow::Continue(())
    })
    .unwrap_or_else(|f| panic!("dry run failed:\n{}", f.report()));
    out
}

/// Everything the page must show about `map`, checked against the page.
fn check_page(map: &SweepMap, html: &str, sweep: &BTreeMap<(u64, String), Verdict>) {
    let embedded = embedded_map(html).expect("the page embeds its data");
    assert_eq!(
        &embedded, map,
        "the embedded data is the map the page was drawn from"
    );

    let points = map.points.len() as u64;
    assert!(points > 0);
    for (i, p) in map.points.iter().enumerate() {
        assert_eq!(p.point, i as u64 + 1, "points are 1..=P in order");
        assert!(!p.label.is_empty(), "point {} has a label", p.point);
    }
    // Op boundaries: the spans tile 1..=P in order, and every point names
    // the span it lies in.
    let mut next = 1;
    for (i, span) in map.ops.iter().enumerate() {
        assert_eq!(span.index, i);
        assert_eq!(span.first, next, "op #{i} starts where the previous ended");
        next = span.last + 1;
    }
    assert_eq!(next, points + 1, "the ops cover every point");
    for p in &map.points {
        let span = &map.ops[p.op];
        assert!(
            span.first <= p.point && p.point <= span.last,
            "point {} in op #{}",
            p.point,
            p.op
        );
    }

    // One cell per (point, mode), in the page and in the data, each with
    // the sweep's verdict.
    let tds = cells_in(html);
    assert_eq!(
        tds.len() as u64,
        points * map.modes.len() as u64,
        "one <td> per point and mode"
    );
    assert_eq!(map.cells.len(), tds.len(), "one data cell per point and mode");
    assert_eq!(
        sweep.len(),
        tds.len(),
        "the sweep judged every point under every mode"
    );
    let mut seen = BTreeMap::new();
    for td in &tds {
        let point: u64 = td["data-p"].parse().expect("data-p is a point");
        let mode = td["data-m"].clone();
        let class = td["class"].clone();
        let shown = td["data-v"].clone();
        assert!(
            class.contains(&format!("v-{shown}")),
            "class {class:?} shows {shown:?}"
        );
        assert!(seen.insert((point, mode), shown).is_none(), "duplicate cell");
    }
    for ((point, mode), verdict) in sweep {
        let want = verdict.class().trim_start_matches("v-");
        assert_eq!(
            seen.get(&(*point, mode.clone())).map(String::as_str),
            Some(want),
            "point {point} {mode}: the page shows the sweep's verdict"
        );
    }
    for c in &map.cells {
        assert_eq!(sweep.get(&(c.point, mode_key(c.mode))), Some(&c.verdict));
    }

    // Failing cells link to an entry beside the grid with the repro command.
    let failed: Vec<_> = map
        .cells
        .iter()
        .filter(|c| c.verdict == Verdict::Failed)
        .collect();
    assert_eq!(
        failed.len(),
        map.failures.len(),
        "one listed failure per failing cell"
    );
    for c in failed {
        let id = format!("f-{}-{}", c.point, mode_key(c.mode));
        assert!(
            html.contains(&format!("<a href=\"#{id}\">")),
            "cell {id} links to its entry"
        );
        let at = html
            .find(&format!("<li id=\"{id}\""))
            .unwrap_or_else(|| panic!("entry {id} listed"));
        let entry = &html[at..at + html[at..].find("</li>").expect("entry closed")];
        assert!(
            entry.contains("--bin repro -- --case "),
            "entry {id} has its repro command: {entry}"
        );
    }
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "self-contained: no network"
    );
}

#[test]
fn tour_report_has_one_cell_per_point_and_mode_with_the_sweeps_verdicts() {
    let ops = tour();
    let kinds = CrashKind::ALL;
    let (map, summary) = map_sweep(7, &ops, &Canaries::none(), &kinds).expect("tour dry run");
    assert!(summary.failures.is_empty(), "the clean tour passes");
    assert_eq!(
        map.ops.len(),
        ops.len() + 1,
        "the install, then every op of the tour"
    );
    let html = render_html(&map, "the tour, seed 7");
    let sweep = sweep_verdicts(7, &ops, &Canaries::none(), &kinds);
    check_page(&map, &html, &sweep);
    let sides = |v| map.cells.iter().filter(|c| c.verdict == v).count();
    assert!(sides(Verdict::Before) > 0, "some crash points roll their op back");
    assert!(sides(Verdict::After) > 0, "some keep it");
}

#[test]
fn report_lists_every_failing_cell_with_its_repro_command() {
    let ops = &tour()[..12];
    let kinds = [CrashKind::PowerStrict];
    let canaries = Canaries::only(Canary::NoDirFsync);
    let (map, summary) = map_sweep(7, ops, &canaries, &kinds).expect("dry run");
    assert!(
        !summary.failures.is_empty(),
        "NoDirFsync fails some point of the prefix"
    );
    assert_eq!(summary.failures.len(), map.failures.len());
    let html = render_html(&map, "tour prefix, NoDirFsync");
    let sweep = sweep_verdicts(7, ops, &canaries, &kinds);
    check_page(&map, &html, &sweep);
}
