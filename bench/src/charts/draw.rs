//! Rendering a [`Chart`] with plotters, once to `<stem>.svg` and once to `<stem>.png`.
//!
//! Text needs a font even in SVG (plotters measures labels to lay out the axes). The font is
//! a TrueType file read at run time, DejaVu Sans from the Debian package fonts-dejavu-core
//! (installed by scripts/install-deps.sh), or the file named by `$BENCH_FONT`; building
//! needs no system library.
//!
//! Every axis uses f64 coordinates with explicit key points: a categorical axis puts
//! category i at x = i and labels it with the category's name.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Bars, Chart, Grouped, Lines, Plot};

/// Where fonts-dejavu-core puts the font.
const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// Names another TTF file to use instead.
const FONT_ENV: &str = "BENCH_FONT";
const FONT: &str = "sans-serif";

/// The result of drawing on one backend.
type Drawing<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;
/// The coordinates of line and grouped-bar charts: keyed x, numeric y.
type Coords = Cartesian2d<Keyed, RangedCoordf64>;

/// An f64 axis whose ticks are exactly `keys` (plotters' own key-point wrapper has no tick
/// formatting for f64, so this is the small version of it that has).
struct Keyed {
    range: Range<f64>,
    keys: Vec<f64>,
}

impl Ranged for Keyed {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        if span <= 0.0 || !v.is_finite() {
            return (limit.0 + limit.1) / 2;
        }
        let at = (v - self.range.start) / span * f64::from(limit.1 - limit.0);
        limit.0 + at.round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.keys.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

/// Draws `chart` as `<dir>/<stem>.svg` and `<dir>/<stem>.png`.
pub fn render(chart: &Chart, dir: &Path) -> Result<()> {
    load_font()?;
    let size = size_of(chart);
    let svg = dir.join(format!("{}.svg", chart.stem));
    draw(SVGBackend::new(&svg, size).into_drawing_area(), chart)
        .with_context(|| format!("drawing {}", svg.display()))?;
    let png = dir.join(format!("{}.png", chart.stem));
    draw(BitMapBackend::new(&png, size).into_drawing_area(), chart)
        .with_context(|| format!("drawing {}", png.display()))
}

/// Registers the font once per process; the error names the package to install.
fn load_font() -> Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        let path =
            std::env::var_os(FONT_ENV).map_or_else(|| PathBuf::from(FONT_PATH), PathBuf::from);
        let bytes = std::fs::read(&path).map_err(|e| {
            format!(
                "reading the chart font {}: {e}; install the Debian package fonts-dejavu-core \
                 (scripts/install-deps.sh) or set {FONT_ENV} to a TrueType file",
                path.display()
            )
        })?;
        // plotters keeps registered fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a TrueType font", path.display()))
    });
    loaded.clone().map_err(anyhow::Error::msg)
}

/// Pixels: taller for a bar chart with many bars.
fn size_of(chart: &Chart) -> (u32, u32) {
    match &chart.plot {
        Plot::Bars(b) => (1000, (120 + 26 * b.bars.len()).max(300) as u32),
        _ => (960, 560),
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, chart: &Chart) -> Result<()> {
    let result = (|| {
        root.fill(&WHITE)?;
        let area = root.titled(&chart.title, (FONT, 22))?;
        match &chart.plot {
            Plot::Lines(l) => lines(&area, l),
            Plot::Bars(b) => bars(&area, b),
            Plot::Grouped(g) => grouped(&area, g),
        }?;
        root.present()
    })();
    result.map_err(|e| anyhow::anyhow!("plotters: {e}"))
}

/// The color of a target, the same in every chart; other series take palette colors.
fn color(name: &str, index: usize) -> RGBColor {
    match name {
        "raw" => RGBColor(120, 120, 120),
        "bindfs" => RGBColor(20, 20, 20),
        "off" => RGBColor(31, 119, 180),
        "cold" => RGBColor(255, 127, 14),
        "warm" | "cache" => RGBColor(44, 160, 44),
        "writeback" => RGBColor(148, 103, 189),
        _ => {
            let (r, g, b) = Palette99::pick(index + 3).rgb();
            RGBColor(r, g, b)
        }
    }
}

/// Tick text for an axis that ends at `top`: "50k" on axes reaching 10 000, whole numbers
/// from 10, one decimal from 1, else two.
fn tick(v: f64, top: f64) -> String {
    let top = top.abs();
    if v == 0.0 {
        "0".into()
    } else if top >= 10_000.0 {
        let k = format!("{:.1}", v / 1000.0);
        format!("{}k", k.strip_suffix(".0").unwrap_or(&k))
    } else if top >= 10.0 {
        format!("{v:.0}")
    } else if top >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The name of category `x` (nearest index), or the number for a numeric axis ending at
/// `top`.
fn category(categories: &[String], x: f64, top: f64) -> String {
    if categories.is_empty() {
        return tick(x, top);
    }
    let i = x.round();
    (i >= 0.0)
        .then(|| categories.get(i as usize))
        .flatten()
        .cloned()
        .unwrap_or_default()
}

/// The x range and key points: categories at 0..n, or the distinct x values padded by 5 %.
fn x_axis(categories: &[String], xs: impl Iterator<Item = f64>) -> Keyed {
    if !categories.is_empty() {
        let n = categories.len() as f64;
        let keys = (0..categories.len()).map(|i| i as f64).collect();
        return Keyed {
            range: -0.5..n - 0.5,
            keys,
        };
    }
    let mut keys: Vec<f64> = xs.filter(|x| x.is_finite()).collect();
    keys.sort_by(f64::total_cmp);
    keys.dedup();
    let (Some(&lo), Some(&hi)) = (keys.first(), keys.last()) else {
        return Keyed {
            range: 0.0..1.0,
            keys,
        };
    };
    let pad = ((hi - lo) * 0.05).max(0.5);
    Keyed {
        range: lo - pad..hi + pad,
        keys,
    }
}

/// A chart with `x` across and values from 0 up, its mesh, axis names and tick labels
/// drawn (category names on a categorical x axis).
fn value_chart<'a, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, Shift>,
    x: Keyed,
    y_top: f64,
    (x_desc, y_desc): (&str, &str),
    categories: &[String],
) -> Result<ChartContext<'a, DB, Coords>, DrawingAreaErrorKind<DB::ErrorType>> {
    let x_top = x.range.end;
    let y_top = (y_top * 1.15).max(1.0);
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, 0.0..y_top)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| category(categories, *x, x_top))
        .y_label_formatter(&|y| tick(*y, y_top))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(BLACK.mix(0.03))
        .draw()?;
    Ok(chart)
}

/// The legend, top left.
fn legend<'a, DB: DrawingBackend + 'a>(chart: &mut ChartContext<'a, DB, Coords>) -> Drawing<DB> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font((FONT, 14))
        .draw()
}

/// A line per series with its points (labelled when they carry a label), and the levels
/// as dashed lines.
fn lines<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, l: &Lines) -> Drawing<DB> {
    let points = || l.series.iter().flat_map(|s| s.points.iter());
    let x = x_axis(&l.categories, points().map(|p| p.0));
    let x_range = x.range.clone();
    let y_top = points()
        .map(|p| p.1)
        .chain(l.levels.iter().map(|v| v.1))
        .fold(0.0, f64::max);
    let descs = (l.x_desc.as_str(), l.y_desc.as_str());
    let mut chart = value_chart(area, x, y_top, descs, &l.categories)?;
    for (i, s) in l.series.iter().enumerate() {
        let c = color(&s.name, i);
        let xy = s.points.iter().map(|p| (p.0, p.1));
        chart
            .draw_series(LineSeries::new(xy, c.stroke_width(2)).point_size(4))?
            .label(&s.name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
        let labelled = s.points.iter().filter(|p| !p.2.is_empty());
        chart.draw_series(labelled.map(|p| {
            EmptyElement::at((p.0, p.1)) + Text::new(p.2.clone(), (6, -18), (FONT, 13))
        }))?;
    }
    for (i, (name, y)) in l.levels.iter().enumerate() {
        let c = color(name.split(' ').next().unwrap_or(name), l.series.len() + i);
        let ends = [(x_range.start, *y), (x_range.end, *y)];
        chart
            .draw_series(DashedLineSeries::new(ends, 8, 5, c.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(2)));
    }
    legend(&mut chart)
}

/// Horizontal bars, first at the top, each with its value; green at or above the last mark,
/// orange above the first, red below; a vertical line per mark (the last solid).
fn bars<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, b: &Bars) -> Drawing<DB> {
    let n = b.bars.len();
    if n == 0 {
        return Ok(());
    }
    // Bar i (from the top) sits at y = n - 1 - i, so the axis reads the names reversed.
    let row = |i: usize| (n - 1 - i) as f64;
    let names: Vec<String> = b.bars.iter().rev().map(|(name, _)| name.clone()).collect();
    let font: TextStyle = (FONT, 14).into();
    let widest = names.iter().try_fold(0, |widest, name| {
        area.estimate_text_size(name, &font)
            .map(|(w, _)| widest.max(w))
    })?;
    let x_top = (b.bars.iter().map(|v| v.1))
        .chain(b.marks.iter().copied())
        .fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(widest + 16)
        .build_cartesian_2d(
            0.0..(x_top * 1.12).max(0.1),
            Keyed {
                range: -0.5..n as f64 - 0.5,
                keys: (0..n).map(|i| i as f64).collect(),
            },
        )?;
    chart
        .configure_mesh()
        .x_desc(&b.x_desc)
        .x_label_formatter(&|x| tick(*x, x_top))
        .y_label_formatter(&|y| category(&names, *y, 0.0))
        .label_style(font.clone())
        .axis_desc_style((FONT, 16))
        .bold_line_style(BLACK.mix(0.12))
        .light_line_style(BLACK.mix(0.03))
        .draw()?;
    let (low, high) = (
        b.marks.first().copied().unwrap_or(0.0),
        b.marks.last().copied().unwrap_or(0.0),
    );
    chart.draw_series(b.bars.iter().enumerate().map(|(i, &(_, v))| {
        let c = match v {
            v if v >= high => RGBColor(44, 160, 44),
            v if v >= low => RGBColor(255, 127, 14),
            _ => RGBColor(214, 39, 40),
        };
        Rectangle::new([(0.0, row(i) - 0.35), (v, row(i) + 0.35)], c.filled())
    }))?;
    chart.draw_series(b.bars.iter().enumerate().map(|(i, &(_, v))| {
        EmptyElement::at((v, row(i))) + Text::new(format!("{v:.2}"), (4, -7), (FONT, 13))
    }))?;
    for (i, &m) in b.marks.iter().enumerate() {
        let ends = [(m, -0.5), (m, n as f64 - 0.5)];
        if i + 1 == b.marks.len() {
            chart.draw_series(LineSeries::new(ends, BLACK.stroke_width(2)))?;
        } else {
            let dashed = DashedLineSeries::new(ends, 6, 4, BLACK.mix(0.5).stroke_width(2));
            chart.draw_series(dashed)?;
        }
    }
    Ok(())
}

/// Per category, a bar per series side by side, with a legend.
fn grouped<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, g: &Grouped) -> Drawing<DB> {
    let x = x_axis(&g.categories, std::iter::empty());
    let y_top = (g.series.iter().flat_map(|s| s.1.iter().flatten())).fold(0.0, |m, &v| v.max(m));
    let descs = (g.x_desc.as_str(), g.y_desc.as_str());
    let mut chart = value_chart(area, x, y_top, descs, &g.categories)?;
    let width = 0.8 / g.series.len().max(1) as f64;
    for (j, (name, values)) in g.series.iter().enumerate() {
        let c = color(name, j);
        let left = |i: usize| i as f64 - 0.4 + j as f64 * width;
        let rects = values.iter().enumerate().filter_map(|(i, v)| {
            let corners = [(left(i), 0.0), (left(i) + width * 0.9, (*v)?)];
            Some(Rectangle::new(corners, c.filled()))
        });
        chart
            .draw_series(rects)?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled()));
    }
    legend(&mut chart)
}
