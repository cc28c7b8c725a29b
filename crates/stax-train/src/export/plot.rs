//! The memory timeline of one step as an SVG: live bytes stacked by category, the peak marked
//! and labelled. [`stacked_series`] computes what is drawn (so tests check the data, not
//! pixels); [`write_svg`] draws it with `plotters`.
//!
//! How to read it: the x axis is the step (its allocation events, or milliseconds for a
//! recorded step); each coloured band is the live bytes of one category, stacked from the
//! bottom (parameters, optimizer state and inputs: the flat persistent floor) to the top
//! (activations, gradients, workspace: what the step adds and frees). The top edge is the total
//! live; the marker is the peak, labelled with its bytes and the buffer whose allocation
//! reached it.
//!
//! ```
//! use stax_alloc::{Category, TraceOp};
//! use stax_train::export::{stacked_series, XAxis};
//! use stax_train::plan::{Timeline, TimelineEvent};
//! let ev = |op, id, bytes| TimelineEvent {
//!     op, id, bytes, category: Category::Activation, name: format!("a{id}"), t_ns: id * 1000,
//! };
//! let mut baseline = [0; 7];
//! baseline[Category::Parameter.index()] = 10;
//! let t = Timeline { baseline, events: vec![ev(TraceOp::Alloc, 1, 5), ev(TraceOp::Free, 1, 5)] };
//! let s = stacked_series(&t, XAxis::Events);
//! assert_eq!(s.peak.1, 15);
//! let top = &s.layers.last().unwrap().1; // cumulative: the total
//! assert_eq!(top.iter().cloned().fold(0.0, f64::max), 15.0);
//! ```

use std::path::Path;

use plotters::prelude::*;
use stax_alloc::{Category, human_bytes};

use super::io_error;
use crate::TrainError;
use crate::plan::Timeline;

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Allocation and free events of the step, from 0 (a plan's timeline).
    Events,
    /// Milliseconds since the first event (a recorded step).
    Milliseconds,
}

/// The stacked series of a step, in bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedSeries {
    /// x of each point (a step function: two points per event, before and after).
    pub x: Vec<f64>,
    /// Description of x.
    pub x_label: &'static str,
    /// Categories drawn, bottom to top, each with the cumulative top of its band at each point
    /// (the last layer's values are the total live bytes).
    pub layers: Vec<(Category, Vec<f64>)>,
    /// The peak: x, bytes, and its label (`peak 7.42 GB: dense1.dw`).
    pub peak: (f64, u64, String),
}

/// Bottom-to-top order: the persistent floor first.
const ORDER: [Category; 7] = [
    Category::Parameter,
    Category::OptimizerState,
    Category::Input,
    Category::Activation,
    Category::Gradient,
    Category::Workspace,
    Category::Other,
];

/// The series [`write_svg`] draws for `timeline` (categories never live are left out).
pub fn stacked_series(timeline: &Timeline, axis: XAxis) -> StackedSeries {
    let events = &timeline.events;
    let t0 = events.first().map_or(0, |e| e.t_ns);
    let x_of = |i: usize| match axis {
        XAxis::Events => i as f64,
        XAxis::Milliseconds => events.get(i).map_or(0.0, |e| (e.t_ns - t0) as f64 / 1e6),
    };
    let lives = timeline.live_by_category();
    let mut x = vec![x_of(0)];
    let mut points: Vec<[u64; 7]> = vec![timeline.baseline];
    for (i, live) in lives.iter().enumerate() {
        let prev = *points.last().unwrap_or(&timeline.baseline);
        x.push(x_of(i));
        points.push(prev);
        x.push(x_of(i));
        points.push(*live);
    }
    let end = match axis {
        XAxis::Events => events.len() as f64,
        XAxis::Milliseconds => x.last().copied().unwrap_or(0.0),
    };
    x.push(end);
    points.push(*points.last().unwrap_or(&timeline.baseline));
    let drawn: Vec<Category> = ORDER
        .into_iter()
        .filter(|c| points.iter().any(|p| p[c.index()] > 0))
        .collect();
    let mut layers = Vec::new();
    let mut below = vec![0u64; points.len()];
    for c in drawn {
        for (b, p) in below.iter_mut().zip(&points) {
            *b += p[c.index()];
        }
        layers.push((c, below.iter().map(|&v| v as f64).collect()));
    }
    let peak = timeline.peak();
    let (px, what) = match peak.event {
        Some(i) => (x_of(i), format!(": {}", events[i].name)),
        None => (x_of(0), String::new()),
    };
    let label = format!(
        "peak {}{what}",
        human_bytes(peak.bytes).split(" (").next().unwrap_or("")
    );
    StackedSeries {
        x,
        x_label: match axis {
            XAxis::Events => "step event (allocation or free)",
            XAxis::Milliseconds => "time in the step (ms)",
        },
        layers,
        peak: (px, peak.bytes, label),
    }
}

fn color(c: Category) -> RGBColor {
    match c {
        Category::Parameter => RGBColor(31, 119, 180),
        Category::OptimizerState => RGBColor(174, 199, 232),
        Category::Input => RGBColor(148, 103, 189),
        Category::Activation => RGBColor(255, 127, 14),
        Category::Gradient => RGBColor(44, 160, 44),
        Category::Workspace => RGBColor(214, 39, 40),
        Category::Other => RGBColor(127, 127, 127),
    }
}

/// The unit the y axis uses for values up to `max` bytes: name and scale.
fn unit(max: f64) -> (&'static str, f64) {
    [("GB", 1e9), ("MB", 1e6), ("kB", 1e3)]
        .into_iter()
        .find(|&(_, s)| max >= s)
        .unwrap_or(("bytes", 1.0))
}

/// Draws `series` as an SVG file at `path` (1000x560), titled `title`.
///
/// # Errors
/// [`TrainError::Io`] when drawing or writing fails.
pub fn write_svg(series: &StackedSeries, title: &str, path: &Path) -> Result<(), TrainError> {
    let err = |e: &dyn std::fmt::Display| io_error("write_svg", path, e);
    let root = SVGBackend::new(path, (1000, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let top = series.layers.last().map_or(&[][..], |l| &l.1[..]);
    let max = top.iter().copied().fold(1.0, f64::max);
    let (unit_name, scale) = unit(max);
    let x_max = series.x.last().copied().unwrap_or(1.0).max(1e-9);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, 0f64..max / scale * 1.15)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(series.x_label)
        .y_desc(format!("live bytes ({unit_name})"))
        .draw()
        .map_err(|e| err(&e))?;
    for (c, tops) in series.layers.iter().rev() {
        let col = color(*c);
        let pts: Vec<(f64, f64)> = series
            .x
            .iter()
            .zip(tops)
            .map(|(&x, &y)| (x, y / scale))
            .collect();
        chart
            .draw_series(AreaSeries::new(pts, 0.0, col.mix(0.85)).border_style(col))
            .map_err(|e| err(&e))?
            .label(c.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], col.filled()));
    }
    let (px, bytes, label) = &series.peak;
    let py = *bytes as f64 / scale;
    chart
        .draw_series(std::iter::once(Circle::new((*px, py), 5, BLACK.filled())))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(std::iter::once(PathElement::new(
            vec![(0.0, py), (x_max, py)],
            BLACK.mix(0.5).stroke_width(1),
        )))
        .map_err(|e| err(&e))?;
    let anchor = if *px > x_max * 0.6 { x_max * 0.02 } else { *px };
    chart
        .draw_series(std::iter::once(Text::new(
            label.clone(),
            (anchor, py + max / scale * 0.05),
            ("sans-serif", 16).into_font(),
        )))
        .map_err(|e| err(&e))?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}
