//! Report figures, each written as SVG and PNG from the same drawing code: line charts (learning
//! curves, value curves R_t / v_t), horizontal bar charts (the credit benchmark's top-1 per method)
//! and the σ heat-map (a trace's segments, one per line, shaded by their credit σ_t).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

/// The font PNG text is drawn with (SVG text names the family and the viewer draws it).
static FONT: &[u8] = include_bytes!("../../data/fonts/DejaVuSans.ttf");

fn register_font() -> Result<()> {
    static DONE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).map_err(|_| "the shipped font does not parse".to_string()))
        .clone()
        .map_err(|e| anyhow!(e))
}

/// Distinct series colours: matplotlib's tab10, the categorical palette of most plotting
/// libraries (gray in the sixth place, where charts name it), so that ten lines of one chart are
/// told apart.
pub const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(127, 127, 127),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// ± half-widths of vertical error bars, one per point (empty: no error bars).
    pub errors: Vec<f64>,
    pub color: RGBColor,
}

pub struct LineChart {
    pub title: String,
    pub x_desc: String,
    pub y_desc: String,
    pub series: Vec<Series>,
}

/// A figure that draws itself on any backend (so SVG and PNG come from one drawing code).
trait Figure {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()>;
}

/// Writes `<stem>.svg` and `<stem>.png` of `fig` and returns their paths.
fn both(stem: &Path, size: (u32, u32), fig: &impl Figure) -> Result<Vec<PathBuf>> {
    register_font()?;
    let svg = stem.with_extension("svg");
    let png = stem.with_extension("png");
    {
        let root = SVGBackend::new(&svg, size).into_drawing_area();
        fig.draw(&root)?;
        root.present().map_err(|e| anyhow!("{}: {e}", svg.display()))?;
    }
    {
        let root = BitMapBackend::new(&png, size).into_drawing_area();
        fig.draw(&root)?;
        root.present().map_err(|e| anyhow!("{}: {e}", png.display()))?;
    }
    Ok(vec![svg, png])
}

/// An x tick as a reader writes it: training steps as "3", not "3.0"; fractions to 3 decimals.
fn tick_label(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

fn padded(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let (lo, hi) = if lo.is_finite() && hi.is_finite() { (lo, hi) } else { (0.0, 1.0) };
    let pad = ((hi - lo) * 0.05).max(1e-3);
    (lo - pad)..(hi + pad)
}

impl Figure for LineChart {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        draw_line_chart(root, self)
    }
}

fn draw_line_chart<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &LineChart) -> Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing `{}`: {e}", c.title);
    root.fill(&WHITE).map_err(e)?;
    let pts = || c.series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0.is_finite() && p.1.is_finite());
    let (x0, x1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    // The y range covers the error bars too.
    let bars = || c.series.iter().flat_map(|s| s.points.iter().zip(&s.errors)).filter(|(p, e)| p.1.is_finite() && e.is_finite());
    let (y0, y1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (y0, y1) = bars().fold((y0, y1), |(a, b), (p, e)| (a.min(p.1 - e), b.max(p.1 + e)));
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(padded(x0, x1), padded(y0, y1))
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc(&c.x_desc)
        .y_desc(&c.y_desc)
        .x_label_formatter(&|x| tick_label(*x))
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(e)?;
    for s in &c.series {
        let color = s.color;
        let points: Vec<(f64, f64)> = s.points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(e)?
            .label(&s.label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(e)?;
        let with_bars = s.points.iter().zip(&s.errors).filter(|(p, e)| p.0.is_finite() && p.1.is_finite() && e.is_finite() && **e > 0.0);
        chart
            .draw_series(with_bars.map(|(&(x, y), &err)| ErrorBar::new_vertical(x, y - err, y, y + err, color.stroke_width(1), 8)))
            .map_err(e)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    Ok(())
}

/// A line chart as `<stem>.svg` and `<stem>.png`.
pub fn line_chart(stem: &Path, chart: &LineChart) -> Result<Vec<PathBuf>> {
    both(stem, (900, 560), chart)
}

const ROW_H: i32 = 20;
const HEATMAP_W: u32 = 1100;

/// Background of a segment: white to red with σ / max σ (blue for negative σ).
fn sigma_color(sigma: f64, max_abs: f64) -> RGBColor {
    let a = if max_abs > 0.0 { (sigma.abs() / max_abs).clamp(0.0, 1.0) } else { 0.0 };
    let fade = |full: u8| (255.0 - a * (255.0 - full as f64)).round() as u8;
    if sigma >= 0.0 {
        RGBColor(255, fade(60), fade(60))
    } else {
        RGBColor(fade(60), fade(60), 255)
    }
}

/// One line of the heat-map: segment number, σ and the segment's text (newlines shown as ⏎,
/// long text cut with …).
fn heatmap_line(i: usize, text: &str, sigma: f64) -> String {
    let flat: String = text.replace('\n', "⏎ ");
    let cut: String = flat.chars().take(110).collect();
    let more = if flat.chars().count() > 110 { "…" } else { "" };
    format!("{:>3}  σ={sigma:.3}  {cut}{more}", i + 1)
}

struct Heatmap<'a> {
    title: &'a str,
    segments: &'a [(String, f64)],
}

impl Figure for Heatmap<'_> {
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        draw_heatmap(root, self.title, self.segments)
    }
}

fn draw_heatmap<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, title: &str, segments: &[(String, f64)]) -> Result<()> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing `{title}`: {e}");
    root.fill(&WHITE).map_err(e)?;
    root.draw(&Text::new(title.to_string(), (10, 8), ("sans-serif", 18).into_font())).map_err(e)?;
    let max_abs = segments.iter().map(|(_, s)| s.abs()).fold(0.0, f64::max);
    for (i, (text, sigma)) in segments.iter().enumerate() {
        let y = 40 + i as i32 * ROW_H;
        root.draw(&Rectangle::new([(0, y), (HEATMAP_W as i32, y + ROW_H - 2)], sigma_color(*sigma, max_abs).filled())).map_err(e)?;
        root.draw(&Text::new(heatmap_line(i, text, *sigma), (6, y + 3), ("sans-serif", 13).into_font())).map_err(e)?;
    }
    Ok(())
}

/// The σ heat-map of one trace: `segments` are (text, σ_t) in order.
pub fn sigma_heatmap(stem: &Path, title: &str, segments: &[(String, f64)]) -> Result<Vec<PathBuf>> {
    let h = 50 + segments.len().max(1) as u32 * ROW_H as u32;
    both(stem, (HEATMAP_W, h), &Heatmap { title, segments })
}

/// One bar of a bar chart: a labelled value with a ± error (NaN: none).
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub error: f64,
}

struct BarChart<'a> {
    title: &'a str,
    x_desc: &'a str,
    bars: &'a [Bar],
    /// A labelled horizontal reference line (e.g. chance).
    line: Option<(&'a str, f64)>,
}

impl Figure for BarChart<'_> {
    /// Horizontal bars, one row per bar from the top, its label on the left axis.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<()> {
        let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("drawing `{}`: {e}", self.title);
        root.fill(&WHITE).map_err(e)?;
        let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
        let top = self.bars.iter().map(|b| finite(b.value) + finite(b.error)).chain(self.line.map(|l| finite(l.1))).fold(0.0, f64::max);
        let n = self.bars.len().max(1);
        // Row i sits at y = n − 1 − i, so the first bar is on top.
        let y_of = |i: usize| (n - 1 - i) as f64;
        let labels: Vec<String> = self.bars.iter().map(|b| b.label.clone()).collect();
        let mut chart = ChartBuilder::on(root)
            .caption(self.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(130)
            .build_cartesian_2d(0.0..(top * 1.1).max(1e-3), -0.6..(n as f64 - 0.4))
            .map_err(e)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc(self.x_desc)
            .y_labels(n)
            .y_label_formatter(&|y| {
                let r = y.round();
                if (y - r).abs() > 1e-6 || r < 0.0 || r as usize >= n {
                    return String::new();
                }
                labels.get(n - 1 - r as usize).cloned().unwrap_or_default()
            })
            .label_style(("sans-serif", 13))
            .draw()
            .map_err(e)?;
        for (i, b) in self.bars.iter().enumerate().filter(|(_, b)| b.value.is_finite()) {
            let (y, color) = (y_of(i), PALETTE[i % PALETTE.len()]);
            chart.draw_series(std::iter::once(Rectangle::new([(0.0, y - 0.35), (b.value, y + 0.35)], color.mix(0.8).filled()))).map_err(e)?;
            if b.error.is_finite() && b.error > 0.0 {
                chart
                    .draw_series(std::iter::once(ErrorBar::new_horizontal(y, b.value - b.error, b.value, b.value + b.error, BLACK.stroke_width(1), 10)))
                    .map_err(e)?;
            }
        }
        if let Some((label, x)) = self.line.filter(|l| l.1.is_finite()) {
            chart
                .draw_series(LineSeries::new(vec![(x, -0.6), (x, n as f64 - 0.4)], BLACK.stroke_width(2)))
                .map_err(e)?
                .label(format!("{label} = {x:.3}"))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
            chart.configure_series_labels().position(SeriesLabelPosition::LowerRight).background_style(WHITE.mix(0.85)).border_style(BLACK).label_font(("sans-serif", 14)).draw().map_err(e)?;
        }
        Ok(())
    }
}

/// A horizontal bar chart (one bar per `bars` from the top, with error bars, and an optional
/// vertical reference line) as `<stem>.svg` and `<stem>.png`; `x_desc` names the values.
pub fn bar_chart(stem: &Path, title: &str, x_desc: &str, bars: &[Bar], line: Option<(&str, f64)>) -> Result<Vec<PathBuf>> {
    let h = 120 + 34 * bars.len().max(1) as u32;
    both(stem, (900, h), &BarChart { title, x_desc, bars, line })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigma_shading_scales_with_credit_and_sign() {
        assert_eq!(sigma_color(0.0, 1.0), RGBColor(255, 255, 255));
        assert_eq!(sigma_color(1.0, 1.0), RGBColor(255, 60, 60));
        assert_eq!(sigma_color(-0.5, 1.0).2, 255);
        assert!(heatmap_line(0, "a\nb", 0.25).starts_with("  1  σ=0.250  a⏎ b"));
        assert!(heatmap_line(2, &"x".repeat(200), 0.0).ends_with('…'));
    }

    #[test]
    fn ticks_read_like_steps_and_short_fractions() {
        assert_eq!(tick_label(3.0), "3");
        assert_eq!(tick_label(10.0), "10");
        assert_eq!(tick_label(0.30000000000000004), "0.3");
        assert_eq!(tick_label(-0.0001), "0");
        assert_eq!(tick_label(2.125), "2.125");
    }
}
