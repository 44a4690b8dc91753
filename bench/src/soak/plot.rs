//! soak.png: one panel per series over the run's seconds, the warm-up
//! shaded, and the fitted line of the judged part.

use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;

use super::sample::SERIES;
use super::Soak;
use crate::plot::{register_font, FONT};

const SIZE: (u32, u32) = (1400, 1300);
const LINE: RGBColor = RGBColor(66, 133, 244);
const FIT: RGBColor = RGBColor(219, 68, 55);

pub(crate) fn draw(png: &Path, font: &Path, soak: &Soak) -> Result<()> {
    register_font(font)?;
    draw_with_font(png, soak).map_err(|e| anyhow!("drawing {}: {e}", png.display()))
}

fn draw_with_font(png: &Path, soak: &Soak) -> Result<(), Box<dyn std::error::Error>> {
    let canvas = BitMapBackend::new(png, SIZE).into_drawing_area();
    canvas.fill(&WHITE)?;
    let title = format!(
        "Sluice soak, {:.0} min: {}",
        soak.seconds / 60.0,
        if soak.passed() { "every series flat after warm-up" } else { "FAILED" }
    );
    let root = canvas.titled(&title, (FONT, 24))?;
    let panels = root.split_evenly((4, 2));
    let end = soak.samples.last().map_or(1.0, |s| s.at).max(1.0);
    for (panel, ((name, unit, value), (_, _, verdict))) in
        panels.iter().zip(SERIES.iter().zip(&soak.verdicts))
    {
        let points: Vec<(f64, f64)> =
            soak.samples.iter().map(|s| (s.at, value(s))).filter(|(_, v)| v.is_finite()).collect();
        let top = points.iter().map(|p| p.1).fold(1.0, f64::max) * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{name} ({unit}): {}", if verdict.pass { "flat" } else { "FAIL" }), (FONT, 16))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..end, 0f64..top)?;
        chart.configure_mesh().x_desc("seconds").label_style((FONT, 12)).draw()?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (soak.warmup.min(end), top)],
            BLACK.mix(0.08).filled(),
        )))?;
        chart.draw_series(LineSeries::new(points.iter().copied(), LINE.stroke_width(2)))?;
        // The fitted line through the judged part, from its mean and slope.
        let judged: Vec<f64> = points.iter().filter(|p| p.0 >= soak.warmup).map(|p| p.0).collect();
        if let (Some(first), Some(last)) = (judged.first(), judged.last()) {
            let mid = judged.iter().sum::<f64>() / judged.len() as f64;
            let slope = verdict.slope_per_hour / 3600.0;
            let at = |t: f64| verdict.mean + slope * (t - mid);
            chart.draw_series(LineSeries::new(
                [(*first, at(*first)), (*last, at(*last))],
                FIT.stroke_width(2),
            ))?;
        }
    }
    root.present()?;
    Ok(())
}
