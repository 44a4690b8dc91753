//! The plot: one panel per fixed rate, and in each, every setup's p50, p90
//! and p99 latency as grouped bars. Text is drawn by ab_glyph from a font
//! file (Debian's DejaVu Sans), so no system font lookup is involved.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::load::{Run, P50, P90, P99};
use super::setups::Setup;

const SIZE: (u32, u32) = (1100, 900);
pub(crate) const FONT: &str = "sans-serif";
/// p50, p90, p99.
const COLORS: [RGBColor; 3] = [RGBColor(66, 133, 244), RGBColor(251, 188, 5), RGBColor(219, 68, 55)];

/// Draws `fixed` (each rate's setups and their median runs) into `png`.
pub(crate) fn draw(png: &Path, font: &Path, title: &str, fixed: &[(u32, Vec<(Setup, Run)>)]) -> Result<()> {
    register_font(font)?;
    draw_with_font(png, title, fixed).map_err(|e| anyhow!("drawing {}: {e}", png.display()))
}

/// Makes `font` the one every plot's text is drawn with, as `FONT`.
pub(crate) fn register_font(font: &Path) -> Result<()> {
    let bytes = std::fs::read(font).with_context(|| format!("reading the font {}", font.display()))?;
    // plotters keeps fonts for the life of the process.
    plotters::style::register_font(FONT, FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| anyhow!("{} is not a font ab_glyph can read", font.display()))
}

fn draw_with_font(
    png: &Path,
    title: &str,
    fixed: &[(u32, Vec<(Setup, Run)>)],
) -> Result<(), Box<dyn std::error::Error>> {
    let canvas = BitMapBackend::new(png, SIZE).into_drawing_area();
    canvas.fill(&WHITE)?;
    let root = canvas.titled(title, (FONT, 24))?;
    let panels = root.split_evenly((fixed.len().max(1), 1));
    for (panel, (rate, runs)) in panels.iter().zip(fixed) {
        let n = runs.len();
        let top = runs.iter().map(|(_, r)| r.p99).filter(|v| v.is_finite()).fold(0.1, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{rate} requests/s, fixed rate"), (FONT, 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..n as f64, 0f64..top)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_label_formatter(&|_| String::new())
            .y_desc("latency (ms)")
            .label_style((FONT, 14))
            .draw()?;
        // Setup names under each group of bars, placed by hand: a numeric axis
        // would label round numbers, not the groups.
        let below = TextStyle::from((FONT, 14)).pos(Pos::new(HPos::Center, VPos::Top));
        for (i, (setup, _)) in runs.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
            canvas.draw(&Text::new(setup.short(), (x, y + 10), below.clone()))?;
        }
        for (k, (name, value)) in [P50, P90, P99].into_iter().enumerate() {
            let color = COLORS[k];
            let bars = runs.iter().enumerate().map(move |(i, (_, run))| {
                let left = i as f64 + 0.12 + k as f64 * 0.25;
                Rectangle::new([(left, 0.0), (left + 0.24, value(run))], color.filled())
            });
            chart
                .draw_series(bars)?
                .label(name)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .label_font((FONT, 14))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
