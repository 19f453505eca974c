//! `poolgate replay --timeline FILE.svg`: one lane per candidate, coloured
//! by its state over time, with the convergence windows, `PoolReady` marks
//! (with epochs), and run commits and faults.
//!
//! The replay samples the gate's readiness report after each instant's
//! records ([`Timeline::sample`]) and hands it every event
//! ([`Timeline::saw`]); [`Timeline::svg`] draws the result.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use poolgate_actors::core::{Blocker, Event, NodeId, PoolPhase, PoolReport, Time, Verdict};

/// A candidate's state as a lane shows it: the first blocker in this order,
/// or ready.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum LaneState {
    NotKnown,
    NotLive,
    Suspect,
    NotAvailable,
    NoIdentity,
    Faulted,
    Ready,
}

impl LaneState {
    const ALL: [LaneState; 7] = [
        LaneState::NotKnown,
        LaneState::NotLive,
        LaneState::Suspect,
        LaneState::NotAvailable,
        LaneState::NoIdentity,
        LaneState::Faulted,
        LaneState::Ready,
    ];

    fn of(verdict: Verdict) -> Self {
        if verdict.has(Blocker::Unknown) {
            LaneState::NotKnown
        } else if verdict.has(Blocker::Faulted) {
            LaneState::Faulted
        } else if verdict.has(Blocker::Suspect) {
            LaneState::Suspect
        } else if verdict.has(Blocker::NotLive) {
            LaneState::NotLive
        } else if verdict.has(Blocker::NotAvailable) {
            LaneState::NotAvailable
        } else if verdict.has(Blocker::NoIdentity) {
            LaneState::NoIdentity
        } else {
            LaneState::Ready
        }
    }

    fn name(self) -> &'static str {
        match self {
            LaneState::NotKnown => "not known",
            LaneState::NotLive => "not live",
            LaneState::Suspect => "suspect",
            LaneState::NotAvailable => "not available",
            LaneState::NoIdentity => "no identity",
            LaneState::Faulted => "faulted",
            LaneState::Ready => "ready",
        }
    }

    fn colour(self) -> &'static str {
        match self {
            LaneState::NotKnown => "#bdbdbd",
            LaneState::NotLive => "#616161",
            LaneState::Suspect => "#ff9800",
            LaneState::NotAvailable => "#90caf9",
            LaneState::NoIdentity => "#ce93d8",
            LaneState::Faulted => "#e53935",
            LaneState::Ready => "#43a047",
        }
    }
}

/// What the replay saw, for drawing.
#[derive(Debug, Default)]
pub struct Timeline {
    /// Per candidate: (from, state) changes in time order.
    lanes: BTreeMap<NodeId, Vec<(Time, LaneState)>>,
    /// Convergence windows: (start, deadline).
    windows: Vec<(Time, Time)>,
    /// Vertical marks: (at, label, colour).
    marks: Vec<(Time, String, &'static str)>,
    end: Time,
}

impl Timeline {
    /// The report after the records of instant `at`.
    pub fn sample(&mut self, at: Time, report: &PoolReport) {
        self.end = self.end.max(at);
        for candidate in &report.candidates {
            let state = LaneState::of(candidate.verdict);
            let lane = self.lanes.entry(candidate.node.clone()).or_default();
            if lane.last().map(|(_, s)| *s) != Some(state) {
                lane.push((at, state));
            }
        }
        let current = match report.phase {
            PoolPhase::Converging { deadline } => Some((report.last_change.at, deadline)),
            _ => None,
        };
        // A window that is no longer the current one ended at its deadline
        // (PoolReady) or, if cut short by a change, at that change.
        if let Some(last) = self.windows.last_mut() {
            if Some(*last) != current && last.1 > at {
                last.1 = at.max(last.0);
            }
        }
        if let Some(window) = current {
            if self.windows.last() != Some(&window) {
                self.windows.push(window);
            }
        }
    }

    /// An event of the gate.
    pub fn saw(&mut self, event: &Event) {
        let at = event.at();
        self.end = self.end.max(at);
        let mark = match event {
            Event::PoolReady { epoch, .. } => Some((format!("ready e{epoch}"), "#2e7d32")),
            Event::ReadinessLost { .. } => Some(("lost".to_string(), "#757575")),
            Event::RunCommitted { run, .. } => Some((format!("commit {run}"), "#1565c0")),
            Event::RunFaulted { run, .. } => Some((format!("fault {run}"), "#c62828")),
            _ => None,
        };
        if let Some((label, colour)) = mark {
            self.marks.push((at, label, colour));
        }
    }

    /// The picture, as a standalone SVG document.
    pub fn svg(&self) -> String {
        const LEFT: f64 = 110.0;
        const WIDTH: f64 = 900.0;
        const TOP: f64 = 64.0;
        let lane_height = if self.lanes.len() > 40 { 8.0 } else { 16.0 };
        let end = self.end.offset().as_secs_f64().max(0.001) * 1.05;
        // The last state of each lane runs to the right edge.
        let edge = Time::from_offset(std::time::Duration::from_secs_f64(end));
        let x = |t: Time| LEFT + t.offset().as_secs_f64() / end * WIDTH;
        let height = TOP + lane_height * self.lanes.len() as f64 + 40.0;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="11">"#,
            LEFT + WIDTH + 20.0
        );
        svg.push_str("<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
        for (i, state) in LaneState::ALL.iter().enumerate() {
            let lx = LEFT + i as f64 * 110.0;
            let _ = writeln!(
                svg,
                r#"<rect x="{lx}" y="8" width="12" height="12" fill="{}"/><text x="{}" y="18">{}</text>"#,
                state.colour(),
                lx + 16.0,
                state.name()
            );
        }
        let lanes_bottom = TOP + lane_height * self.lanes.len() as f64;
        for (row, (node, changes)) in self.lanes.iter().enumerate() {
            let y = TOP + row as f64 * lane_height;
            let _ = writeln!(
                svg,
                r#"<g class="lane" data-node="{}">"#,
                escape(node.as_str())
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{:.1}" text-anchor="end" font-size="{}">{}</text>"#,
                LEFT - 6.0,
                y + lane_height * 0.8,
                (lane_height - 1.0).min(11.0),
                escape(node.as_str())
            );
            for (i, (from, state)) in changes.iter().enumerate() {
                let to = changes.get(i + 1).map(|(t, _)| *t).unwrap_or(edge);
                let _ = writeln!(
                    svg,
                    r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{} {}–{}</title></rect>"#,
                    x(*from),
                    (x(to) - x(*from)).max(1.0),
                    lane_height - 2.0,
                    state.colour(),
                    state.name(),
                    from,
                    to
                );
            }
            svg.push_str("</g>\n");
        }
        for (start, deadline) in &self.windows {
            let _ = writeln!(
                svg,
                r##"<rect class="window" x="{:.1}" y="{}" width="{:.1}" height="{}" fill="#fff59d" fill-opacity="0.45" stroke="#f9a825" stroke-dasharray="3,2"/>"##,
                x(*start),
                TOP - 4.0,
                (x(*deadline) - x(*start)).max(1.0),
                lanes_bottom - TOP + 8.0
            );
        }
        for (i, (at, label, colour)) in self.marks.iter().enumerate() {
            let mx = x(*at);
            let label_y = TOP - 10.0 - (i % 2) as f64 * 12.0;
            let _ = writeln!(
                svg,
                r#"<line class="mark" x1="{mx:.1}" y1="{}" x2="{mx:.1}" y2="{lanes_bottom}" stroke="{colour}" stroke-width="1.5"/><text x="{:.1}" y="{label_y}" fill="{colour}">{}</text>"#,
                TOP - 8.0,
                mx + 2.0,
                escape(label)
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{LEFT}" y="{}">0 s</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            lanes_bottom + 20.0,
            LEFT + WIDTH,
            lanes_bottom + 20.0,
            self.end
        );
        svg.push_str("</svg>\n");
        svg
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
